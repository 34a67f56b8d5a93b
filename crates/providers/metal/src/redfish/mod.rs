//! A minimal Redfish client: find a machine's System through the BMC's Systems collection and
//! read its `PowerState`, `UUID` and `SerialNumber`, bounded and timed out.
//!
//! BMCs are slow, flaky and name their Systems their own way (`System.Embedded.1` on iDRAC,
//! `1` on iLO, XCC and Supermicro), so the System is never guessed from the node name:
//! - it is the collection member the config names (`system`, `system_uuid`, `system_serial`)
//!   or, with none of them, the collection's only member;
//! - [`Lookup::Gone`] — the one answer that lets a Node be deleted — needs the service root
//!   and the Systems collection to answer and the System, seen before by this process, to be
//!   missing from it. A System never seen (a typo, a BMC with several Systems) is an error that
//!   names the machine and what the BMC offers; 404 on a System path, 401, 5xx, timeouts and
//!   TLS failures are errors too;
//! - the whole lookup (login, root, collection, System) is bounded by one timeout and one
//!   shared concurrency limit.

mod transport;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use crate::config::BmcConfig;
pub use transport::SESSIONS_PATH;
use transport::{Auth, Reply, Transport};

/// The service root every Redfish service serves (DSP0266).
pub const SERVICE_ROOT: &str = "/redfish/v1/";

/// What a BMC says about one System's power.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    /// `PowerState` is `On` (or `PoweringOn`, `PoweringOff`, `Paused`: still running).
    On,
    /// `PowerState` is `Off`.
    Off,
    /// The System is gone: see [`Lookup::Gone`].
    NoSuchSystem,
}

/// A System as the BMC describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct System {
    /// Its path, e.g. `/redfish/v1/Systems/System.Embedded.1`.
    pub path: String,
    /// `On` or `Off`.
    pub power: Power,
    /// `UUID`, if the BMC reports one.
    pub uuid: Option<String>,
    /// `SerialNumber`, if the BMC reports one.
    pub serial: Option<String>,
}

/// The answer of a lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The System, read just now.
    Found(System),
    /// Root and collection answered, and the System seen before is not in the collection.
    Gone {
        /// The member ids the collection lists.
        offered: Vec<String>,
    },
}

/// Why a BMC gave no usable answer. Never "machine gone".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcError {
    /// No answer within the timeout.
    #[error("BMC {endpoint} did not answer within {timeout:?}")]
    Timeout {
        /// The endpoint.
        endpoint: String,
        /// The timeout.
        timeout: Duration,
    },
    /// Connection, TLS or protocol failure, or an answer that does not settle the question.
    #[error("BMC {endpoint}: {message}")]
    Failed {
        /// The endpoint.
        endpoint: String,
        /// What went wrong (never includes credentials).
        message: String,
    },
    /// The BMC answered 429 Too Many Requests: the controllers must slow down, not retry at
    /// once (BMCs cap concurrent requests and sessions).
    #[error("BMC {endpoint} throttled the request: {message}")]
    Throttled {
        /// The endpoint.
        endpoint: String,
        /// Which request.
        message: String,
        /// The BMC's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
}

impl BmcError {
    /// The cloud error the controllers act on: `Throttled` (with the BMC's hint) for a 429,
    /// `Transient` for everything else — never "gone".
    pub fn into_cloud_error(self, machine: &str) -> ccm_cloud::CloudError {
        let message = format!("machine {machine}: {self}");
        match self {
            BmcError::Throttled { retry_after, .. } => ccm_cloud::CloudError::Throttled {
                message,
                retry_after,
            },
            _ => ccm_cloud::CloudError::Transient(message),
        }
    }
}

/// Why a step of a lookup gave no answer: a message, or the BMC's 429.
enum Why {
    Msg(String),
    Throttled {
        message: String,
        retry_after: Option<Duration>,
    },
}

impl From<String> for Why {
    fn from(m: String) -> Self {
        Why::Msg(m)
    }
}

/// How the config picks the machine's System out of the collection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Selector {
    Id(String),
    Path(String),
    Uuid(String),
    Serial(String),
    OnlyMember,
}

impl Selector {
    fn of(bmc: &BmcConfig, node: &str) -> Self {
        if let Some(s) = &bmc.system {
            let s = s.replace("{name}", node);
            return if s.starts_with('/') {
                Selector::Path(s.trim_end_matches('/').to_string())
            } else {
                Selector::Id(s)
            };
        }
        if let Some(u) = &bmc.system_uuid {
            return Selector::Uuid(u.to_ascii_lowercase());
        }
        if let Some(s) = &bmc.system_serial {
            return Selector::Serial(s.clone());
        }
        Selector::OnlyMember
    }

    fn matches_path(&self, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        match self {
            Selector::Id(id) => path.rsplit('/').next() == Some(id.as_str()),
            Selector::Path(p) => path == p,
            _ => false,
        }
    }

    fn matches_system(&self, sys: &System) -> bool {
        match self {
            Selector::Uuid(u) => {
                sys.uuid.as_deref().map(str::to_ascii_lowercase) == Some(u.clone())
            }
            Selector::Serial(s) => sys.serial.as_deref() == Some(s.as_str()),
            _ => self.matches_path(&sys.path) || *self == Selector::OnlyMember,
        }
    }

    fn describe(&self) -> String {
        match self {
            Selector::Id(id) => format!("System {id:?}"),
            Selector::Path(p) => format!("System {p:?}"),
            Selector::Uuid(u) => format!("System with UUID {u}"),
            Selector::Serial(s) => format!("System with SerialNumber {s:?}"),
            Selector::OnlyMember => "single System".into(),
        }
    }
}

/// `(endpoint, selector)`: one machine's System on one BMC.
type SystemKey = (String, Selector);

/// Shared Redfish client: connection pools, sessions, the Systems found so far, one
/// concurrency bound.
#[derive(Clone)]
pub struct Redfish {
    transport: Arc<Transport>,
    /// Where each machine's System was found (the fast path: one GET per lookup).
    found: Arc<Mutex<HashMap<SystemKey, String>>>,
    /// Systems found at least once: only these can be [`Lookup::Gone`].
    seen: Arc<Mutex<HashSet<SystemKey>>>,
    permits: Arc<Semaphore>,
    timeout: Duration,
}

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish")
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Redfish {
    /// A client allowing `concurrency` lookups in flight, each bounded by `timeout` in all.
    pub fn new(concurrency: usize, timeout: Duration) -> Self {
        Redfish {
            // The lookup's own deadline fires first and reports a timeout; the connect
            // timeout only ends connection attempts hyper would go on with in the background.
            transport: Arc::new(Transport::new(timeout * 2)),
            found: Arc::default(),
            seen: Arc::default(),
            permits: Arc::new(Semaphore::new(concurrency.max(1))),
            timeout,
        }
    }

    /// The power state of `node`'s System, with the config's credentials.
    pub async fn power(&self, bmc: &BmcConfig, node: &str) -> Result<Power, BmcError> {
        Ok(match self.lookup(bmc, node, None).await? {
            Lookup::Found(s) => s.power,
            Lookup::Gone { .. } => Power::NoSuchSystem,
        })
    }

    /// Finds and reads `node`'s System, with `(user, password)` from elsewhere (a Secret)
    /// instead of the config's `username` / `password_file` when given.
    pub async fn lookup(
        &self,
        bmc: &BmcConfig,
        node: &str,
        credentials: Option<(String, String)>,
    ) -> Result<Lookup, BmcError> {
        let fail = |message: String| BmcError::Failed {
            endpoint: bmc.endpoint.clone(),
            message,
        };
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| fail("client closed".into()))?;
        let auth = Auth::of(bmc, credentials).map_err(fail)?;
        let key = (bmc.endpoint.clone(), Selector::of(bmc, node));
        match tokio::time::timeout(self.timeout, self.find(bmc, &auth, &key)).await {
            Ok(r) => r.map_err(|why| match why {
                Why::Msg(m) => fail(m),
                Why::Throttled {
                    message,
                    retry_after,
                } => BmcError::Throttled {
                    endpoint: bmc.endpoint.clone(),
                    message,
                    retry_after,
                },
            }),
            Err(_) => Err(BmcError::Timeout {
                endpoint: bmc.endpoint.clone(),
                timeout: self.timeout,
            }),
        }
    }

    async fn find(&self, bmc: &BmcConfig, auth: &Auth, key: &SystemKey) -> Result<Lookup, Why> {
        let known = self.found.lock().get(key).cloned();
        if let Some(path) = known {
            let r = self.transport.get(bmc, auth, &path).await?;
            match r.status {
                StatusCode::OK => {
                    let sys = parse_system(&path, &r.body)?;
                    // Another machine at the same path (UUID / serial changed): look again.
                    if key.1.matches_system(&sys) {
                        return Ok(Lookup::Found(sys));
                    }
                }
                // Maybe renumbered, maybe gone: only the collection can tell.
                StatusCode::NOT_FOUND => {}
                _ => return Err(status_error("GET", &path, &r)),
            }
        }
        let members = self.members(bmc, auth).await?;
        match self.pick(bmc, auth, &key.1, &members).await? {
            Some(sys) => {
                self.found.lock().insert(key.clone(), sys.path.clone());
                self.seen.lock().insert(key.clone());
                Ok(Lookup::Found(sys))
            }
            None if self.seen.lock().contains(key) => {
                self.found.lock().remove(key);
                Ok(Lookup::Gone {
                    offered: ids(&members),
                })
            }
            None => Err(format!(
                "no {} among the BMC's Systems {:?}; set bmc.system to one of these ids (or bmc.system_uuid / bmc.system_serial)",
                key.1.describe(),
                ids(&members)
            )
            .into()),
        }
    }

    /// The member paths of the Systems collection; both the service root and the collection
    /// must answer 200 with Redfish JSON.
    async fn members(&self, bmc: &BmcConfig, auth: &Auth) -> Result<Vec<String>, Why> {
        let root = self.get_json(bmc, auth, SERVICE_ROOT).await?;
        let systems = root
            .pointer("/Systems/@odata.id")
            .and_then(|v| v.as_str())
            .ok_or_else(|| format!("the service root {SERVICE_ROOT} has no Systems link"))?
            .to_string();
        let coll = self.get_json(bmc, auth, &systems).await?;
        let members = coll
            .get("Members")
            .and_then(|m| m.as_array())
            .ok_or_else(|| format!("the Systems collection {systems} has no Members"))?;
        Ok(members
            .iter()
            .map(|m| {
                m.get("@odata.id")
                    .and_then(|v| v.as_str())
                    .map(|s| s.trim_end_matches('/').to_string())
                    .ok_or_else(|| format!("a member of {systems} has no @odata.id"))
            })
            .collect::<Result<_, _>>()?)
    }

    /// The member `sel` names, read; `None` when the collection does not have it.
    async fn pick(
        &self,
        bmc: &BmcConfig,
        auth: &Auth,
        sel: &Selector,
        members: &[String],
    ) -> Result<Option<System>, Why> {
        let path = match sel {
            Selector::Id(_) | Selector::Path(_) => members.iter().find(|m| sel.matches_path(m)),
            Selector::OnlyMember => match members {
                [one] => Some(one),
                _ => {
                    return Err(format!(
                        "the BMC has {} Systems {:?}, so bmc.system (or bmc.system_uuid / bmc.system_serial) must say which is this machine",
                        members.len(),
                        ids(members)
                    )
                    .into());
                }
            },
            Selector::Uuid(_) | Selector::Serial(_) => {
                for m in members {
                    let sys = self.read(bmc, auth, m).await?;
                    if sel.matches_system(&sys) {
                        return Ok(Some(sys));
                    }
                }
                None
            }
        };
        match path {
            Some(p) => self.read(bmc, auth, p).await.map(Some),
            None => Ok(None),
        }
    }

    /// A System the collection lists; any failure (even 404) is an error here.
    async fn read(&self, bmc: &BmcConfig, auth: &Auth, path: &str) -> Result<System, Why> {
        let r = self.transport.get(bmc, auth, path).await?;
        if r.status != StatusCode::OK {
            return Err(status_error("GET", path, &r));
        }
        Ok(parse_system(path, &r.body)?)
    }

    async fn get_json(
        &self,
        bmc: &BmcConfig,
        auth: &Auth,
        path: &str,
    ) -> Result<serde_json::Value, Why> {
        let r = self.transport.get(bmc, auth, path).await?;
        if r.status != StatusCode::OK {
            return Err(status_error("GET", path, &r));
        }
        Ok(serde_json::from_slice(&r.body)
            .map_err(|e| format!("GET {path}: not a Redfish JSON document: {e}"))?)
    }
}

/// A non-200 answer: throttling (429) kept apart so it reaches the controllers as such.
fn status_error(verb: &str, path: &str, r: &Reply) -> Why {
    let message = format!("{verb} {path}: HTTP {}", r.status);
    if r.status == StatusCode::TOO_MANY_REQUESTS {
        Why::Throttled {
            message,
            retry_after: r.retry_after,
        }
    } else {
        Why::Msg(message)
    }
}

fn ids(members: &[String]) -> Vec<String> {
    members
        .iter()
        .map(|m| m.rsplit('/').next().unwrap_or(m).to_string())
        .collect()
}

fn parse_system(path: &str, body: &[u8]) -> Result<System, String> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| format!("GET {path}: not a Redfish JSON document: {e}"))?;
    let power = match v.get("PowerState").and_then(|p| p.as_str()) {
        Some("Off") => Power::Off,
        Some("On" | "PoweringOn" | "PoweringOff" | "Paused") => Power::On,
        Some(other) => return Err(format!("GET {path}: unknown PowerState {other:?}")),
        None => return Err(format!("GET {path}: the System has no PowerState")),
    };
    let text = |k: &str| {
        v.get(k)
            .and_then(|s| s.as_str())
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Ok(System {
        path: path.trim_end_matches('/').to_string(),
        power,
        uuid: text("UUID"),
        serial: text("SerialNumber"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors() {
        let mut b = BmcConfig::default();
        assert_eq!(Selector::of(&b, "n1"), Selector::OnlyMember);
        b.system = Some("{name}-sys".into());
        let id = Selector::of(&b, "n1");
        assert!(id.matches_path("/redfish/v1/Systems/n1-sys/"));
        assert!(!id.matches_path("/redfish/v1/Systems/n1"));
        b.system = Some("/redfish/v1/Systems/1/".into());
        assert!(Selector::of(&b, "x").matches_path("/redfish/v1/Systems/1"));
        b.system = None;
        b.system_uuid = Some("ABC".into());
        let sys = System {
            path: "/redfish/v1/Systems/1".into(),
            power: Power::On,
            uuid: Some("abc".into()),
            serial: None,
        };
        assert!(Selector::of(&b, "x").matches_system(&sys));
    }

    #[test]
    fn power_states() {
        let p = |b: &[u8]| parse_system("/s", b).map(|s| s.power);
        assert_eq!(p(br#"{"PowerState":"Off"}"#), Ok(Power::Off));
        assert_eq!(p(br#"{"PowerState":"On"}"#), Ok(Power::On));
        assert!(p(br#"{"Name":"x"}"#).is_err());
        assert!(p(b"<html>").is_err());
    }
}
