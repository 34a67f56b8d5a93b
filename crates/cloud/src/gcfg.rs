//! The INI dialect of upstream providers' cloud-configs (Go's gcfg, read by
//! cloud-provider-aws, cloud-provider-openstack and others): `[Section]` and
//! `[Section "subsection"]` headers, `Name = value` lines, `;` and `#` comments, values
//! optionally in double quotes with `\"`, `\\`, `\n`, `\t` escapes, a bare `Name` meaning
//! `true`. Section and key names compare case-insensitively. Every entry keeps its line number
//! so errors can point at it.
//!
//! In the framework because a drop-in provider must read the operator's existing cloud-config
//! file unchanged, and every such provider then reports a bad line the same way. Hand-written
//! rather than a general INI crate: gcfg's subsection headers (`[LoadBalancerClass "name"]`),
//! repeated keys for lists and line-numbered errors are what this format needs; the common INI
//! crates treat subsection headers as plain section names and drop line numbers.

/// One `Name = value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// 1-based line number.
    pub line: usize,
    /// The key as written.
    pub key: String,
    /// The value, unquoted; `None` for a bare `Name` (gcfg: boolean true).
    pub value: Option<String>,
}

/// One section with its entries in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// 1-based line of the header.
    pub line: usize,
    /// The section name as written (`Global`, `ServiceOverride`).
    pub name: String,
    /// The subsection (`"1"` of `[ServiceOverride "1"]`), unquoted.
    pub sub: Option<String>,
    /// Its entries.
    pub entries: Vec<Entry>,
}

/// A syntax error: the line and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line number.
    pub line: usize,
    /// What was expected.
    pub message: String,
}

/// Parses `text` into sections.
pub fn parse(text: &str) -> Result<Vec<Section>, SyntaxError> {
    let mut out: Vec<Section> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| SyntaxError { line, message };
        let l = raw.trim();
        if l.is_empty() || l.starts_with(';') || l.starts_with('#') {
            continue;
        }
        if l.starts_with('[') {
            out.push(header(l, line).map_err(err)?);
            continue;
        }
        let Some(section) = out.last_mut() else {
            return Err(err(format!(
                "{} comes before any section; put it under [Global]",
                shown_key(l)
            )));
        };
        section.entries.push(entry(l, line).map_err(err)?);
    }
    Ok(out)
}

fn is_name(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

fn header(l: &str, line: usize) -> Result<Section, String> {
    let body = strip_comment(l.strip_prefix('[').unwrap_or(l));
    let Some(body) = body.trim_end().strip_suffix(']') else {
        return Err(
            "the section header is not closed; expected [Name] or [Name \"sub\"]".to_string(),
        );
    };
    let body = body.trim();
    let (name, sub) = match body.split_once(char::is_whitespace) {
        None => (body, None),
        Some((name, rest)) => {
            let rest = rest.trim();
            let quoted = rest
                .strip_prefix('"')
                .and_then(|r| r.strip_suffix('"'))
                .filter(|_| rest.len() >= 2);
            match quoted {
                Some(q) => (name, Some(unescape(q)?)),
                None => {
                    return Err(format!(
                        "the subsection must be in double quotes, e.g. [{} \"1\"]",
                        if is_name(name) { name } else { "Name" }
                    ));
                }
            }
        }
    };
    if !is_name(name) {
        return Err(
            "the section name is not a valid name (letters, digits, '-' and '_')".to_string(),
        );
    }
    Ok(Section {
        line,
        name: name.to_string(),
        sub,
        entries: Vec::new(),
    })
}

fn entry(l: &str, line: usize) -> Result<Entry, String> {
    let (key, value) = match l.split_once('=') {
        Some((k, v)) => (
            k.trim(),
            Some(value_of(v).map_err(|e| format!("{}: {e}", shown_key(l)))?),
        ),
        None => (strip_comment(l).trim(), None),
    };
    if !is_name(key) {
        return Err(
            "the line is not `Name = value` (names are letters, digits, '-' and '_')".to_string(),
        );
    }
    Ok(Entry {
        line,
        key: key.to_string(),
        value,
    })
}

/// The key of a `Name = value` line for an error message, or "the line" when it is no name:
/// errors never quote a line's text, which may be a password.
fn shown_key(l: &str) -> String {
    let key = l.split_once('=').map_or(l, |(k, _)| k).trim();
    if is_name(key) {
        format!("`{key}`")
    } else {
        "the line".to_string()
    }
}

/// Cuts a `;` or `#` comment that starts outside double quotes.
fn strip_comment(s: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ';' | '#' if !quoted => return &s[..i],
            _ => {}
        }
    }
    s
}

/// A value: unquoted parts trimmed, quoted parts kept as written, escapes resolved.
fn value_of(raw: &str) -> Result<String, String> {
    let v = strip_comment(raw).trim();
    let mut out = String::new();
    let mut quoted = false;
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => out.push(escape(chars.next())?),
            _ => out.push(c),
        }
    }
    if quoted {
        return Err("the value has an unclosed double quote".to_string());
    }
    Ok(out)
}

fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(escape(chars.next())?),
            _ => out.push(c),
        }
    }
    Ok(out)
}

fn escape(c: Option<char>) -> Result<char, String> {
    match c {
        Some('"') => Ok('"'),
        Some('\\') => Ok('\\'),
        Some('n') => Ok('\n'),
        Some('t') => Ok('\t'),
        other => Err(format!(
            "unknown escape \\{}; gcfg knows \\\" \\\\ \\n \\t",
            other.map(String::from).unwrap_or_default()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_entries_and_comments() {
        let text = "; upstream example\n[Global]\nZone = us-east-1a ; trailing\nKubernetesClusterTag=\"my cluster\"\nDisableSecurityGroupIngress\n\n[ServiceOverride \"1\"]\n  Service = ec2\n  URL = https://ec2.foo.bar#x\n";
        let s = parse(text).expect("parses");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "Global");
        assert_eq!(s[0].entries[0].value.as_deref(), Some("us-east-1a"));
        assert_eq!(s[0].entries[1].value.as_deref(), Some("my cluster"));
        assert_eq!(s[0].entries[2].value, None);
        assert_eq!(s[0].entries[2].line, 5);
        assert_eq!(s[1].sub.as_deref(), Some("1"));
        assert_eq!(
            s[1].entries[1].value.as_deref(),
            Some("https://ec2.foo.bar")
        );
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let e = parse("Region = x\n").expect_err("no section");
        assert_eq!(e.line, 1);
        let e = parse("[Global]\nRegion = \"x\n").expect_err("quote");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unclosed"), "{}", e.message);
        let e = parse("[Global]\n[ServiceOverride 1]\n").expect_err("sub");
        assert_eq!(e.line, 2);
        let e = parse("[Global\n").expect_err("header");
        assert!(e.message.contains("not closed"), "{}", e.message);
        let e = parse("[Global]\nthis is = bad\n").expect_err("name");
        assert_eq!(e.line, 2);
    }

    /// Found by the `openstack_config` fuzz target: syntax errors quoted the line, and the line
    /// can hold a password.
    #[test]
    fn syntax_errors_never_quote_the_line() {
        for (text, says) in [
            (
                "[Global]\npassword = \"s3cretPassw0rd\n",
                "`password`: the value has an unclosed",
            ),
            (
                "password = s3cretPassw0rd\n[Global]\n",
                "`password` comes before any section",
            ),
            ("[Global-password = s3cretPassw0rd\n", "not closed"),
            ("[Global s3cretPassw0rd]\n", "double quotes, e.g. [Global"),
            ("[s3cretPassw0rd!]\n", "section name is not a valid name"),
            (
                "[Global]\npass word = s3cretPassw0rd\n",
                "not `Name = value`",
            ),
            (
                "[Global]\nx s3cretPassw0rd = \"y\n",
                "the line: the value has an unclosed",
            ),
        ] {
            let e = parse(text).expect_err(text);
            assert!(
                !e.message.contains("s3cretPassw0rd"),
                "{text:?}: {}",
                e.message
            );
            assert!(e.message.contains(says), "{text:?}: {}", e.message);
        }
    }
}
