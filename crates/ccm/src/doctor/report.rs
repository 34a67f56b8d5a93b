//! Findings and how they are shown: ✅ / ⚠️ / ❌ text for people, JSON for scripts, and the
//! exit status (0 all ok, 1 warnings, 2 failures) for both.

use std::fmt::Write as _;

/// How one check came out. Ordered by severity so the worst verdict is the maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// The check could not apply (nothing to look at); counts as ok for the exit status.
    Skip,
    /// Nothing wrong.
    Ok,
    /// Something an operator should look at; the cluster still works.
    Warn,
    /// Broken: nodes or Services are not served.
    Fail,
}

impl Verdict {
    /// The symbol the issue and the README use.
    pub fn symbol(self) -> &'static str {
        match self {
            Verdict::Skip => "➖",
            Verdict::Ok => "✅",
            Verdict::Warn => "⚠️ ",
            Verdict::Fail => "❌",
        }
    }
}

/// The outcome of one check: what was seen and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Stable identifier (`uninitialized-taint`), for scripts and `--output json`.
    pub check: &'static str,
    /// The verdict.
    pub verdict: Verdict,
    /// One line saying what was found.
    pub summary: String,
    /// The objects and facts behind the verdict, one per line.
    pub evidence: Vec<String>,
    /// What to do, naming the object; empty when nothing is to be done.
    pub fix: Vec<String>,
}

impl Finding {
    /// A finding without evidence or fix.
    pub fn new(check: &'static str, verdict: Verdict, summary: impl Into<String>) -> Self {
        Finding {
            check,
            verdict,
            summary: summary.into(),
            evidence: Vec::new(),
            fix: Vec::new(),
        }
    }

    /// Adds evidence lines.
    pub fn evidence<I, S>(mut self, lines: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.evidence.extend(lines.into_iter().map(Into::into));
        self
    }

    /// Adds a fix line.
    pub fn fix(mut self, line: impl Into<String>) -> Self {
        self.fix.push(line.into());
        self
    }
}

/// Everything `ccm doctor` found, with what it looked at.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The API server asked.
    pub cluster: String,
    /// Counts of what was read, for the header line.
    pub seen: Seen,
    /// One finding per check, in checklist order.
    pub findings: Vec<Finding>,
    /// The worst verdict.
    pub verdict: Verdict,
    /// The exit status this report maps to.
    pub exit_code: u8,
}

/// What the snapshot held, and when and where it was taken: a report pasted into a ticket
/// says which cluster, which versions and which moment it describes.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Seen {
    /// When doctor read the cluster (RFC 3339, UTC).
    pub time: String,
    /// This doctor's version.
    pub doctor_version: String,
    /// The API server's `/version` gitVersion (or why it is unknown).
    pub server_version: String,
    /// The kubeconfig context used (empty: in-cluster or the current one unnamed).
    pub context: String,
    /// Nodes.
    pub nodes: usize,
    /// Services of type LoadBalancer.
    pub load_balancer_services: usize,
    /// Pods taken for the cloud-controller-manager.
    pub ccm_pods: usize,
}

impl Report {
    /// Builds a report; the verdict and exit code follow from the findings.
    pub fn new(cluster: String, seen: Seen, findings: Vec<Finding>) -> Self {
        let verdict = findings
            .iter()
            .map(|f| f.verdict)
            .max()
            .unwrap_or(Verdict::Ok);
        Report {
            cluster,
            seen,
            findings,
            verdict,
            exit_code: exit_code(verdict),
        }
    }

    /// The human-readable form.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "ccm doctor: {} — {} nodes, {} LoadBalancer services, {} CCM pods",
            self.cluster, self.seen.nodes, self.seen.load_balancer_services, self.seen.ccm_pods
        );
        let s = &self.seen;
        let _ = writeln!(
            out,
            "  at {} · doctor {} · server {} · context {}",
            or_dash(&s.time),
            or_dash(&s.doctor_version),
            or_dash(&s.server_version),
            or_dash(&s.context)
        );
        for f in &self.findings {
            let _ = writeln!(
                out,
                "\n{} {:<22} {}",
                f.verdict.symbol(),
                f.check,
                f.summary
            );
            for e in &f.evidence {
                let _ = writeln!(out, "     · {e}");
            }
            for (i, fix) in f.fix.iter().enumerate() {
                let label = if i == 0 { "fix:" } else { "    " };
                let _ = writeln!(out, "     {label} {fix}");
            }
        }
        let count = |v: Verdict| self.findings.iter().filter(|f| f.verdict == v).count();
        let _ = writeln!(
            out,
            "\n{} ok, {} warnings, {} failures{}",
            count(Verdict::Ok),
            count(Verdict::Warn),
            count(Verdict::Fail),
            match count(Verdict::Skip) {
                0 => String::new(),
                n => format!(", {n} not applicable"),
            }
        );
        out
    }

    /// The JSON form (`--output json`).
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// 0 when every check is ok (or not applicable), 1 with warnings, 2 with failures.
pub fn exit_code(worst: Verdict) -> u8 {
    match worst {
        Verdict::Skip | Verdict::Ok => 0,
        Verdict::Warn => 1,
        Verdict::Fail => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_verdict_sets_the_exit_code() {
        let ok = Finding::new("a", Verdict::Ok, "fine");
        let warn = Finding::new("b", Verdict::Warn, "hmm");
        let fail = Finding::new("c", Verdict::Fail, "broken").fix("do X to node n1");
        let skip = Finding::new("d", Verdict::Skip, "n/a");
        let r = |f: Vec<Finding>| Report::new("x".into(), Seen::default(), f).exit_code;
        assert_eq!(r(vec![ok.clone(), skip.clone()]), 0);
        assert_eq!(r(vec![ok.clone(), warn.clone()]), 1);
        assert_eq!(r(vec![warn, fail.clone(), ok]), 2);
        let text = Report::new("x".into(), Seen::default(), vec![fail, skip]).text();
        assert!(text.contains("❌ c"), "{text}");
        assert!(text.contains("fix: do X to node n1"), "{text}");
        assert!(
            text.contains("0 ok, 0 warnings, 1 failures, 1 not applicable"),
            "{text}"
        );
    }
}
