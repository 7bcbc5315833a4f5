//! Who may open which export: the server's authorisation rule, decided from what the
//! connection proved (its TLS client certificate, or that it is local) and what the export
//! name asks for. Pure: no I/O, so every case is a unit test below.
//!
//! ```text
//!  export                      who may open it
//!  NAME, NAME@V (read-only)    an administrator's or a server's certificate; a caller in
//!                              `plain_reads` scope (default: local)
//!  NAME[@V]+DEV[+persistent]   an administrator's certificate; a caller in `plain_writes`
//!                              scope (default: local for a standalone server, nobody for a
//!                              farm server)
//!  NAME+private                an administrator's certificate; or `plain_writes` scope
//!  ferry-s-KEY (a session)     the certificate of the session's device, or an
//!                              administrator's; never without TLS
//! ```
//!
//! **A device's certificate opens its session only** (issue 30): the session export its
//! login granted, which stands for the version the farm's rules give that device
//! (a maintenance version to a maintenance device only), so a device cannot name another
//! vDisk or version, nor another device's write cache. Listing the exports needs the same
//! as reading one plainly.
//!
//! **Recording a boot set** ([`AccessPolicy::record_as`]) is a write to state every later
//! boot of the version reads ahead: the device of a session opened with its own
//! certificate, an administrator, or a caller in `plain_writes` scope; never an anonymous
//! reader.
//!
//! "Local" is the unix socket or a loopback address. A caller that is neither allowed
//! plainly nor authenticated gets `TlsRequired` (NBD_REP_ERR_TLS_REQD: a standard client
//! then retries with TLS); an authenticated caller that is not the owner gets `Forbidden`.
//! A session that does not exist and a session of another device are refused alike, so a
//! refusal tells an outsider nothing about which sessions exist.

use contract::{ExportName, Mac};
use pki::Identity;

/// Which callers may do something without a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Nobody: a certificate is required.
    None,
    /// Callers on the unix socket or a loopback address.
    Local,
    /// Anyone who reaches the port (not recommended beyond a lab).
    Any,
}

impl Scope {
    fn admits(self, local: bool) -> bool {
        match self {
            Scope::None => false,
            Scope::Local => local,
            Scope::Any => true,
        }
    }
}

/// The server's access rule (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Who may open read-only exports without a certificate.
    pub plain_reads: Scope,
    /// Who may open writable exports (server caches, private mode) without a certificate.
    pub plain_writes: Scope,
}

impl AccessPolicy {
    /// A standalone server's default: local callers read and write plainly (as they could
    /// open the store's files), remote callers need a certificate.
    pub const STANDALONE: AccessPolicy = AccessPolicy {
        plain_reads: Scope::Local,
        plain_writes: Scope::Local,
    };
    /// A farm server's default: local callers read plainly; every write needs the
    /// certificate of the device (or an administrator's).
    pub const FARM: AccessPolicy = AccessPolicy {
        plain_reads: Scope::Local,
        plain_writes: Scope::None,
    };
}

impl Default for AccessPolicy {
    fn default() -> Self {
        AccessPolicy::STANDALONE
    }
}

/// What a connection proved about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// On the unix socket or a loopback address.
    pub local: bool,
    /// The connection runs TLS.
    pub tls: bool,
    /// The identity its verified client certificate names.
    pub identity: Option<Identity>,
}

impl Caller {
    /// Who the caller is, for logs.
    pub fn describe(&self) -> String {
        match (&self.identity, self.tls, self.local) {
            (Some(id), _, _) => id.to_string(),
            (None, true, _) => "an anonymous TLS client".into(),
            (None, false, true) => "a local plain client".into(),
            (None, false, false) => "a remote plain client".into(),
        }
    }
}

/// Why an open is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The caller must use TLS with a certificate (NBD_REP_ERR_TLS_REQD).
    #[error("{0}")]
    TlsRequired(String),
    /// The caller's certificate does not allow it (NBD_REP_ERR_POLICY).
    #[error("{0}")]
    Forbidden(String),
}

/// What a session export stands for, as the farm says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionExport {
    /// The export it grants.
    pub export: ExportName,
    /// The device it was granted to.
    pub device: Mac,
}

impl AccessPolicy {
    /// May `caller` open `export`? For a session, `session` is what it stands for
    /// (`None`: no live session of that name, refused like another device's).
    ///
    /// # Errors
    /// [`Refusal`].
    pub fn check(
        &self,
        caller: &Caller,
        export: &ExportName,
        session: Option<&SessionExport>,
    ) -> Result<(), Refusal> {
        let admin = matches!(caller.identity, Some(Identity::Admin(_)));
        let device = matches!(caller.identity, Some(Identity::Device(_)));
        let need_cert = |what: &str| {
            if device {
                Refusal::Forbidden(format!(
                    "{what}: the certificate of {} opens only the session export its login \
                     granted",
                    caller.describe()
                ))
            } else if caller.identity.is_some() {
                Refusal::Forbidden(format!(
                    "{what}: the certificate of {} does not allow it",
                    caller.describe()
                ))
            } else {
                Refusal::TlsRequired(format!(
                    "{what} needs TLS with a certificate of the farm (the caller is {})",
                    caller.describe()
                ))
            }
        };
        match export {
            ExportName::ReadOnly { .. } => {
                let farm_member = caller.identity.is_some() && !device;
                if farm_member || self.plain_reads.admits(caller.local) {
                    Ok(())
                } else {
                    Err(need_cert("reading a vDisk"))
                }
            }
            ExportName::ServerCache { device, .. } | ExportName::Persistent { device, .. } => {
                if admin || self.plain_writes.admits(caller.local) {
                    Ok(())
                } else {
                    Err(need_cert(&format!("the write cache of device {device}")))
                }
            }
            ExportName::Private { vdisk } => {
                if admin || self.plain_writes.admits(caller.local) {
                    Ok(())
                } else {
                    Err(need_cert(&format!("writing vDisk {vdisk} in private mode")))
                }
            }
            ExportName::Session(_) => {
                let refused =
                    || need_cert("a session export (no live session of that name for this caller)");
                if !caller.tls {
                    return Err(refused());
                }
                let Some(s) = session else {
                    return Err(refused());
                };
                let owner =
                    matches!(&caller.identity, Some(Identity::Device(mac)) if *mac == s.device);
                if admin || owner {
                    Ok(())
                } else {
                    Err(refused())
                }
            }
        }
    }

    /// May `caller` list the exports (names and sizes of read-only exports)? As for reading
    /// one plainly: not with a device's certificate.
    ///
    /// # Errors
    /// [`Refusal::TlsRequired`], [`Refusal::Forbidden`] for a device's certificate.
    pub fn check_list(&self, caller: &Caller) -> Result<(), Refusal> {
        let device = matches!(caller.identity, Some(Identity::Device(_)));
        if (caller.identity.is_some() && !device) || self.plain_reads.admits(caller.local) {
            Ok(())
        } else if device {
            Err(Refusal::Forbidden(format!(
                "listing exports: the certificate of {} opens only its session",
                caller.describe()
            )))
        } else {
            Err(Refusal::TlsRequired(format!(
                "listing exports needs TLS with a certificate of the farm (the caller is {})",
                caller.describe()
            )))
        }
    }

    /// May a connection of `caller` that the access rule let open an export record its
    /// boot into the version's boot set (see the module docs)? `session` is what the
    /// session export it opened stands for (`None`: it opened a plain export).
    pub fn record_as(&self, caller: &Caller, session: Option<&SessionExport>) -> bool {
        let admin = matches!(caller.identity, Some(Identity::Admin(_)));
        match session {
            Some(s) => {
                admin
                    || (caller.tls
                        && matches!(&caller.identity, Some(Identity::Device(mac)) if *mac == s.device))
            }
            None => admin || self.plain_writes.admits(caller.local),
        }
    }
}

#[cfg(test)]
mod tests {
    use contract::SessionKey;

    use super::*;

    const MAC_A: &str = "aa:bb:cc:00:00:0a";
    const MAC_B: &str = "aa:bb:cc:00:00:0b";

    fn mac(s: &str) -> Mac {
        s.parse().unwrap()
    }

    fn name(s: &str) -> ExportName {
        s.parse().unwrap()
    }

    fn caller(local: bool, tls: bool, identity: Option<Identity>) -> Caller {
        Caller {
            local,
            tls,
            identity,
        }
    }

    fn remote_plain() -> Caller {
        caller(false, false, None)
    }

    fn device(m: &str) -> Caller {
        caller(false, true, Some(Identity::Device(mac(m))))
    }

    fn admin() -> Caller {
        caller(false, true, Some(Identity::admin("root").unwrap()))
    }

    fn session_of(m: &str) -> SessionExport {
        SessionExport {
            export: name("golden@3"),
            device: mac(m),
        }
    }

    #[test]
    fn a_remote_client_without_a_certificate_opens_nothing_on_a_farm_server() {
        let p = AccessPolicy::FARM;
        let key = ExportName::Session(SessionKey::from_bytes([7; 16]));
        for export in [
            name("golden"),
            name("golden@2"),
            name("golden+aa-bb-cc-00-00-0a"),
            name("golden@2+aa-bb-cc-00-00-0a+persistent"),
            name("golden+private"),
            key.clone(),
        ] {
            let s = session_of(MAC_A);
            let r = p.check(&remote_plain(), &export, Some(&s));
            assert!(matches!(r, Err(Refusal::TlsRequired(_))), "{export}: {r:?}");
            // TLS alone (no certificate) is not an identity either, except that it
            // satisfies nothing more than plain does.
            let anon = caller(false, true, None);
            assert!(p.check(&anon, &export, Some(&s)).is_err(), "{export}");
        }
        assert!(p.check_list(&remote_plain()).is_err());
    }

    #[test]
    fn a_local_plain_client_reads_but_does_not_write_on_a_farm_server() {
        let p = AccessPolicy::FARM;
        let local = caller(true, false, None);
        assert_eq!(p.check(&local, &name("golden@1"), None), Ok(()));
        assert!(p.check_list(&local).is_ok());
        for w in ["golden+aa-bb-cc-00-00-0a", "golden+private"] {
            assert!(matches!(
                p.check(&local, &name(w), None),
                Err(Refusal::TlsRequired(_))
            ));
        }
    }

    #[test]
    fn a_device_opens_its_session_only() {
        let p = AccessPolicy::FARM;
        let a = device(MAC_A);
        // Issue 30: not a vDisk or version by name (a maintenance one included), not even
        // its own write cache by name, and no list.
        for other in [
            "golden",
            "golden@4",
            "golden+aa-bb-cc-00-00-0a",
            "golden@4+aa-bb-cc-00-00-0a+persistent",
            "golden+aa-bb-cc-00-00-0b+persistent",
            "golden+private",
        ] {
            let r = p.check(&a, &name(other), None);
            assert!(matches!(r, Err(Refusal::Forbidden(_))), "{other}: {r:?}");
        }
        assert!(matches!(p.check_list(&a), Err(Refusal::Forbidden(_))));
        let key = ExportName::Session(SessionKey::from_bytes([1; 16]));
        assert_eq!(p.check(&a, &key, Some(&session_of(MAC_A))), Ok(()));
        let theirs = p.check(&a, &key, Some(&session_of(MAC_B)));
        let missing = p.check(&a, &key, None);
        assert!(theirs.is_err());
        assert_eq!(
            theirs, missing,
            "another device's session looks like no session"
        );
    }

    #[test]
    fn an_administrator_opens_everything_over_tls() {
        let p = AccessPolicy::FARM;
        let key = ExportName::Session(SessionKey::from_bytes([2; 16]));
        for export in [
            name("golden+private"),
            name("golden+aa-bb-cc-00-00-0b"),
            key,
        ] {
            assert_eq!(
                p.check(&admin(), &export, Some(&session_of(MAC_B))),
                Ok(()),
                "{export}"
            );
        }
    }

    #[test]
    fn only_a_session_s_own_device_or_a_writer_records_a_boot() {
        let p = AccessPolicy::FARM;
        let s = session_of(MAC_A);
        assert!(p.record_as(&device(MAC_A), Some(&s)));
        assert!(!p.record_as(&device(MAC_B), Some(&s)));
        assert!(p.record_as(&admin(), None));
        // Anonymous readers, local ones on a farm server included, record nothing.
        assert!(!p.record_as(&caller(true, false, None), None));
        assert!(!p.record_as(&remote_plain(), None));
        assert!(!p.record_as(&caller(false, true, None), None));
        // A standalone server's local clients may write, so they record.
        assert!(AccessPolicy::STANDALONE.record_as(&caller(true, false, None), None));
    }

    #[test]
    fn a_session_is_never_opened_without_tls_even_locally() {
        let key = ExportName::Session(SessionKey::from_bytes([3; 16]));
        let local = caller(true, false, None);
        let open = AccessPolicy {
            plain_reads: Scope::Any,
            plain_writes: Scope::Any,
        };
        assert!(open.check(&local, &key, Some(&session_of(MAC_A))).is_err());
    }

    #[test]
    fn a_standalone_server_lets_local_callers_write_and_refuses_remote_ones() {
        let p = AccessPolicy::STANDALONE;
        let w = name("golden+vm1");
        assert_eq!(p.check(&caller(true, false, None), &w, None), Ok(()));
        assert!(p.check(&remote_plain(), &w, None).is_err());
    }
}
