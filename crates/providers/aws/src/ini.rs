//! Which dialect a cloud-config is in: upstream's gcfg INI (parsed by [`ccm_cloud::gcfg`]) or
//! ccm-rs's TOML. Operators swapping in ccm-rs keep their INI file; TOML stays for new clusters.

pub(crate) use ccm_cloud::gcfg::{Entry, parse};

/// Whether `text` looks like gcfg INI rather than TOML: its first section header is
/// `[Global]` or `[ServiceOverride …]` (any case), or it uses `;` comments.
pub fn looks_like_ini(text: &str) -> bool {
    for raw in text.lines() {
        let l = raw.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        if l.starts_with(';') {
            return true;
        }
        if l.starts_with("[[") {
            return false;
        }
        if let Some(inner) = l.strip_prefix('[') {
            let name: String = inner
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                .collect();
            return name.eq_ignore_ascii_case("global")
                || name.eq_ignore_ascii_case("serviceoverride");
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection() {
        assert!(looks_like_ini("[Global]\nZone = a\n"));
        assert!(looks_like_ini("# c\n[global]\n"));
        assert!(looks_like_ini("[ServiceOverride \"1\"]\n"));
        assert!(!looks_like_ini("region = \"x\"\n[[service_override]]\n"));
        assert!(!looks_like_ini("region = \"x\"\n"));
        assert!(!looks_like_ini(""));
    }
}
