//! Reading a bucket prefix's objects: what is there ([`list`], [`exists`]) and an object's
//! manifest ([`get_manifest`]). The tier store and the transfers are both built on these; this
//! module names neither of them.

use std::collections::HashMap;

use manifest::Manifest;
use object_store::ObjectStore;

use crate::{BucketError, BucketUrl, Keys, MANIFEST_SUFFIX, is_vdisk_file, manifest_name};

/// The most objects listed under one prefix.
pub const MAX_LISTED: usize = 100_000;

/// What a listing of a bucket prefix found.
#[derive(Debug, Default, Clone)]
pub struct Listing {
    /// vDisk files with their manifests, by name, with their sizes.
    pub objects: Vec<(String, u64)>,
    /// vDisk files without a manifest (not served).
    pub unmanifested: Vec<String>,
    /// Manifest sizes by object name.
    pub manifests: HashMap<String, u64>,
}

/// Lists the vDisk objects and manifests directly under `url`'s prefix.
///
/// # Errors
/// [`BucketError::Store`] (unreachable endpoint, refused credentials, no such bucket).
pub async fn list(store: &dyn ObjectStore, url: &BucketUrl) -> Result<Listing, BucketError> {
    let prefix = url.prefix_key();
    let res = store
        .list_with_delimiter(prefix.as_ref())
        .await
        .map_err(BucketError::store("list", url.to_string()))?;
    let mut sizes = HashMap::new();
    for o in res.objects.into_iter().take(MAX_LISTED) {
        if let Some(name) = o.location.filename() {
            sizes.insert(name.to_string(), o.size);
        }
    }
    let mut l = Listing::default();
    for (name, size) in &sizes {
        if let Some(obj) = name.strip_suffix(MANIFEST_SUFFIX) {
            if is_vdisk_file(obj) {
                l.manifests.insert(obj.to_string(), *size);
            }
        } else if is_vdisk_file(name) {
            if sizes.contains_key(&manifest_name(name)) {
                l.objects.push((name.clone(), *size));
            } else {
                l.unmanifested.push(name.clone());
            }
        }
    }
    l.objects.sort();
    l.unmanifested.sort();
    Ok(l)
}

/// Fetches and parses object `name`'s manifest, checking it names the object and its size.
///
/// # Errors
/// [`BucketError::Store`], [`BucketError::Manifest`], [`BucketError::Missing`].
pub async fn get_manifest(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    name: &str,
    object_size: Option<u64>,
) -> Result<Manifest, BucketError> {
    let murl = url.url_of(&manifest_name(name));
    let key = url.key(&manifest_name(name));
    let meta = store
        .head(&key)
        .await
        .map_err(BucketError::store("read", murl.clone()))?;
    if meta.size > manifest::MAX_MANIFEST_BYTES as u64 {
        return Err(BucketError::Manifest {
            url: murl,
            source: manifest::ManifestError::TooLong(meta.size as usize),
        });
    }
    let bytes = store
        .get(&key)
        .await
        .map_err(BucketError::store("read", murl.clone()))?
        .bytes()
        .await
        .map_err(BucketError::store("read", murl.clone()))?;
    let m = Manifest::parse(&bytes).map_err(|source| BucketError::Manifest {
        url: murl.clone(),
        source,
    })?;
    if m.name != name {
        return Err(BucketError::Missing(format!(
            "{murl} describes {:?}, not {name:?}",
            m.name
        )));
    }
    if let Some(s) = object_size
        && s != m.size
    {
        return Err(BucketError::Missing(format!(
            "{} is {s} bytes; its manifest says {}",
            url.url_of(name),
            m.size
        )));
    }
    Ok(m)
}

/// True when object `name` is in the bucket under `url`'s prefix.
///
/// # Errors
/// [`BucketError::Store`] for any answer but "not found".
pub async fn exists(
    store: &dyn ObjectStore,
    url: &BucketUrl,
    name: &str,
) -> Result<bool, BucketError> {
    match store.head(&url.key(name)).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(BucketError::store("check", url.url_of(name))(e)),
    }
}
