//! Fuzzes the names two sides of Ferry must spell alike (`contract`): export names
//! (`NAME[@N][+DEVICE[+persistent]]`, `NAME+private`, `ferry-s-KEY`), vDisk and device names,
//! MAC addresses and cache-mode names, as a client or a farm record may send them; and
//! certificate identities (`urn:ferry:device|admin|server:NAME`), as a peer's certificate
//! may carry them; and bucket store URLs (`s3://BUCKET[/PREFIX]`), as an API client may send
//! them.
//!
//! Input: any bytes, taken as UTF-8 where they are (other bytes are refused before parsing,
//! as the NBD server does with a name that is not UTF-8).
//!
//! Must hold: no panic; a parsed export name prints as a string that parses back to the same
//! name; a parsed MAC prints in its one spelling, which parses back to the same MAC; a parsed
//! cache mode parses back from both of its spellings; a parsed identity prints as a URI that
//! parses back to the same identity, and its name keeps the name rule; a parsed bucket URL
//! prints in its normal form, which parses back to the same URL.
#![no_main]

use contract::{
    BucketUrl, CacheMode, DeviceName, ExportName, IDENTITY_NAME_BYTES_MAX, Identity, Mac, VdiskName,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(name) = s.parse::<ExportName>() {
        let text = name.to_string();
        assert_eq!(
            text.parse::<ExportName>().as_ref(),
            Ok(&name),
            "{s:?} -> {text:?}"
        );
    }
    if let Ok(mac) = s.parse::<Mac>() {
        let text = mac.to_string();
        assert_eq!(text.parse::<Mac>().as_ref(), Ok(&mac), "{s:?} -> {text:?}");
    }
    if let Ok(u) = BucketUrl::parse(s) {
        let text = u.to_string();
        assert_eq!(
            BucketUrl::parse(&text).as_ref(),
            Ok(&u),
            "{s:?} -> {text:?}"
        );
    }
    if let Ok(mode) = s.parse::<CacheMode>() {
        assert_eq!(mode.farm_name().parse::<CacheMode>().ok(), Some(mode));
        assert_eq!(mode.cli_name().parse::<CacheMode>().ok(), Some(mode));
    }
    if let Ok(id) = s.parse::<Identity>() {
        let text = id.to_string();
        assert_eq!(
            text.parse::<Identity>().as_ref(),
            Ok(&id),
            "{s:?} -> {text:?}"
        );
        if let Identity::Admin(name) | Identity::Server(name) = &id {
            assert!(
                !name.is_empty() && name.len() <= IDENTITY_NAME_BYTES_MAX,
                "{s:?}"
            );
            assert!(Identity::admin(name).is_ok(), "{s:?}");
        }
    }
    let _ = Identity::admin(s);
    let _ = Identity::server(s);
    let _ = VdiskName::new(s);
    let _ = DeviceName::new(s);
});
