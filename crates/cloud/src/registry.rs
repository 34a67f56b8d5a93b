//! Providers register by name; `--cloud-provider NAME` picks one and `--cloud-config FILE` is
//! handed to its constructor.
//!
//! Unlike upstream's process-global map, a registry is a value: the binary builds one with the
//! providers it was compiled with, and tests build their own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use crate::error::ConfigError;
use crate::provider::CloudProvider;

/// The contents of `--cloud-config`, with its path kept for error messages.
#[derive(Debug, Clone)]
pub struct CloudConfig {
    /// Where the config came from.
    pub path: PathBuf,
    /// The file's text. Its format is the provider's to define.
    pub contents: String,
}

impl CloudConfig {
    /// Parses TOML into `T`, reporting the dotted path of a bad field, what was expected, and
    /// the file. Most providers want exactly this.
    pub fn parse_toml<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        parse_toml_str(&self.contents).map_err(|e| e.in_file(self.path.display().to_string()))
    }
}

/// Parses TOML text into `T` with field-naming errors (see [`CloudConfig::parse_toml`]).
pub fn parse_toml_str<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
    let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::general(toml_message(&e)))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        ConfigError {
            file: None,
            field: (path != "." && !path.is_empty()).then_some(path),
            expected: toml_message(&inner),
        }
    })
}

fn toml_message(e: &toml::de::Error) -> String {
    match e.span() {
        Some(_) => e.message().to_string(),
        None => e.to_string(),
    }
}

/// Builds a provider from an optional config. Errors name what is wrong and how to fix it.
pub type ProviderFactory =
    Arc<dyn Fn(Option<&CloudConfig>) -> Result<Arc<dyn CloudProvider>, ConfigError> + Send + Sync>;

/// Why a provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Two providers tried to register the same name (fatal upstream too).
    #[error("cloud provider {0:?} was registered twice")]
    Duplicate(String),
    /// `--cloud-provider` was empty.
    #[error("--cloud-provider is required; known providers: {known}")]
    Missing {
        /// Comma-separated registered names.
        known: String,
    },
    /// `--cloud-provider=external` names no provider: it is what kubelets are told, not the CCM.
    #[error(
        "--cloud-provider=external is the kubelet/kube-controller-manager setting; a cloud-controller-manager needs the name of a real provider (known: {known})"
    )]
    External {
        /// Comma-separated registered names.
        known: String,
    },
    /// No provider by that name.
    #[error("unknown cloud provider {name:?}{}; known providers: {known}", suggestion.as_deref().map(|s| format!(" (did you mean {s:?}?)")).unwrap_or_default())]
    Unknown {
        /// The name asked for.
        name: String,
        /// The closest registered name, if any is close.
        suggestion: Option<String>,
        /// Comma-separated registered names.
        known: String,
    },
    /// `--cloud-config` could not be read.
    #[error("--cloud-config {path}: cannot read the file: {source}")]
    Unreadable {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The provider rejected its configuration.
    #[error("could not init cloud provider {name:?}: {source}")]
    Config {
        /// The provider.
        name: String,
        /// What was wrong.
        source: ConfigError,
    },
}

/// The providers a binary knows about.
#[derive(Clone, Default)]
pub struct ProviderRegistry {
    factories: BTreeMap<String, ProviderFactory>,
}

impl std::fmt::Debug for ProviderRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl ProviderRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `factory` under `name`; a second registration of one name is an error.
    pub fn register(
        &mut self,
        name: &str,
        factory: impl Fn(Option<&CloudConfig>) -> Result<Arc<dyn CloudProvider>, ConfigError>
        + Send
        + Sync
        + 'static,
    ) -> Result<(), RegistryError> {
        if self.factories.contains_key(name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        self.factories.insert(name.to_string(), Arc::new(factory));
        Ok(())
    }

    /// Registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    fn known(&self) -> String {
        self.names().collect::<Vec<_>>().join(", ")
    }

    /// Builds the provider `name`, reading `config_path` if given.
    pub fn build(
        &self,
        name: &str,
        config_path: Option<&Path>,
    ) -> Result<Arc<dyn CloudProvider>, RegistryError> {
        if name.is_empty() {
            return Err(RegistryError::Missing {
                known: self.known(),
            });
        }
        if name == "external" {
            return Err(RegistryError::External {
                known: self.known(),
            });
        }
        let Some(factory) = self.factories.get(name) else {
            return Err(RegistryError::Unknown {
                name: name.to_string(),
                suggestion: nearest(name, self.names()),
                known: self.known(),
            });
        };
        let config = match config_path {
            Some(path) => Some(CloudConfig {
                path: path.to_path_buf(),
                contents: std::fs::read_to_string(path).map_err(|source| {
                    RegistryError::Unreadable {
                        path: path.display().to_string(),
                        source,
                    }
                })?,
            }),
            None => None,
        };
        factory(config.as_ref()).map_err(|source| RegistryError::Config {
            name: name.to_string(),
            source: match config_path {
                Some(p) => source.in_file(p.display().to_string()),
                None => source,
            },
        })
    }
}

/// The candidate closest to `word` by edit distance, if it is plausibly a typo of it.
pub fn nearest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= (c.len().max(word.len()) / 3).max(2))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    struct P;
    impl CloudProvider for P {
        fn provider_name(&self) -> &str {
            "p"
        }
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Conf {
        latency: Latency,
    }
    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Latency {
        fixed_ms: u64,
    }

    fn registry() -> ProviderRegistry {
        let mut r = ProviderRegistry::new();
        r.register("sim", |cfg| {
            if let Some(cfg) = cfg {
                cfg.parse_toml::<Conf>()?;
            }
            Ok(Arc::new(P) as Arc<dyn CloudProvider>)
        })
        .expect("first registration");
        r
    }

    #[test]
    fn duplicate_registration_is_refused() {
        let mut r = registry();
        let err = r.register("sim", |_| Ok(Arc::new(P) as Arc<dyn CloudProvider>));
        assert!(matches!(err, Err(RegistryError::Duplicate(n)) if n == "sim"));
    }

    #[test]
    fn unknown_name_suggests_the_nearest() {
        let err = registry().build("smi", None).err().expect("unknown");
        assert_eq!(
            err.to_string(),
            "unknown cloud provider \"smi\" (did you mean \"sim\"?); known providers: sim"
        );
        let err = registry().build("external", None).err().expect("external");
        assert!(
            err.to_string()
                .contains("needs the name of a real provider")
        );
    }

    #[test]
    fn config_errors_name_file_and_field() {
        let dir = std::env::temp_dir().join(format!("ccm-cloud-reg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("cloud.toml");
        std::fs::write(&path, "[latency]\nfixed_ms = \"50ms\"\n").expect("write");
        let err = registry()
            .build("sim", Some(&path))
            .err()
            .expect("bad config");
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(msg.contains("field latency.fixed_ms"), "{msg}");
        assert!(msg.contains("invalid type"), "{msg}");

        let missing = dir.join("nope.toml");
        let err = registry()
            .build("sim", Some(&missing))
            .err()
            .expect("missing");
        assert!(err.to_string().starts_with("--cloud-config "), "{err}");
    }
}
