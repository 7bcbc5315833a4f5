//! The farm's data is private to its owner whatever the umask: a new SQLite farm's data
//! directory is 0700 and its database files 0600, and opening an older farm whose modes
//! were looser tightens them.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use farm::{Farm, FarmConfig};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn config(data: &Path) -> FarmConfig {
    FarmConfig {
        data_dir: data.to_path_buf(),
        db_url: None,
        store_root: None,
    }
}

/// Every `farm.db*` file in `data` with its mode.
fn db_modes(data: &Path) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = std::fs::read_dir(data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("farm.db")
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                mode(&p),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn new_farm_data_is_owner_only() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let farm = Farm::open(&config(&data)).await.unwrap();
    farm.init("modes").await.unwrap();
    assert_eq!(mode(&data), 0o700);
    let files = db_modes(&data);
    assert!(files.iter().any(|(n, _)| n == "farm.db"), "{files:?}");
    for (name, m) in &files {
        assert_eq!(*m, 0o600, "{name} is {m:o}");
    }
}

#[tokio::test]
async fn loose_modes_of_an_older_farm_are_tightened_at_open() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    {
        let farm = Farm::open(&config(&data)).await.unwrap();
        farm.init("modes").await.unwrap();
    }
    let loose = std::fs::Permissions::from_mode;
    std::fs::set_permissions(&data, loose(0o755)).unwrap();
    for (name, _) in db_modes(&data) {
        std::fs::set_permissions(data.join(name), loose(0o644)).unwrap();
    }
    let farm = Farm::open(&config(&data)).await.unwrap();
    assert!(farm.is_initialized().await.unwrap());
    assert_eq!(mode(&data), 0o700);
    for (name, m) in db_modes(&data) {
        assert_eq!(m, 0o600, "{name} is {m:o}");
    }
}
