//! A credential that cannot reach a log line or an error message by accident: its `Debug`
//! and `Display` print `<redacted>`, and the text comes out only through [`Secret::expose`],
//! which is called where the request body to Keystone is built and nowhere else.

/// A password, an application-credential secret or a token.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `s`.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret text, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when unset.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
