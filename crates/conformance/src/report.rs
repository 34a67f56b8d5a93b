//! Results of a run: JSON, JUnit XML and a one-screen summary.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::rules::Rule;

/// How one check of one rule ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// The provider followed the rule.
    Pass,
    /// The provider broke the rule; `detail` says what it did instead.
    Fail {
        /// What the provider did instead of following the rule.
        detail: String,
    },
    /// The check could not run (capability missing, harness cannot do it, read-only level).
    NotRun {
        /// Why.
        reason: String,
    },
    /// The provider broke the rule, as the known-defect list says it does today.
    KnownDefect {
        /// The defect, from the known-defect list.
        defect: String,
        /// What the provider did.
        detail: String,
    },
    /// The rule is on the known-defect list but the provider followed it: the list is stale.
    DefectFixed {
        /// The defect the list still names.
        defect: String,
    },
}

impl Outcome {
    /// Short label for the summary.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail { .. } => "FAIL",
            Outcome::NotRun { .. } => "NOT RUN",
            Outcome::KnownDefect { .. } => "KNOWN DEFECT",
            Outcome::DefectFixed { .. } => "FIXED (stale defect list)",
        }
    }

    /// True for outcomes that make the run fail.
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Fail { .. } | Outcome::DefectFixed { .. })
    }
}

/// One check: a rule proved (or not) in one situation.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    /// The rule.
    pub rule: Rule,
    /// The situation, e.g. `server_error` or `by providerID`.
    pub case: String,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// How long the check took.
    #[serde(serialize_with = "millis")]
    pub duration: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `provider_name()` of the provider under test.
    pub provider: String,
    /// `read-only` or `destructive`.
    pub level: String,
    /// The cluster name the suite used (its resources carry it).
    pub cluster: String,
    /// Every check, in the order run.
    pub results: Vec<CheckResult>,
    /// What the final sweep removed (or failed to remove).
    pub swept: Vec<String>,
    /// True when the run was interrupted (Ctrl-C) before every check ran.
    pub interrupted: bool,
}

impl Report {
    /// True when no check failed and the run was not interrupted.
    pub fn passed(&self) -> bool {
        !self.interrupted && !self.results.iter().any(|r| r.outcome.is_failure())
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(|r| r.outcome.is_failure())
    }

    /// The results of one rule.
    pub fn of(&self, rule_id: &str) -> impl Iterator<Item = &CheckResult> {
        self.results.iter().filter(move |r| r.rule.id == rule_id)
    }

    /// Counts per outcome: pass, fail, not run, known defect.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0);
        for r in &self.results {
            match r.outcome {
                Outcome::Pass => c.0 += 1,
                Outcome::Fail { .. } | Outcome::DefectFixed { .. } => c.1 += 1,
                Outcome::NotRun { .. } => c.2 += 1,
                Outcome::KnownDefect { .. } => c.3 += 1,
            }
        }
        c
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// The report as JUnit XML: one test case per check, named `<rule id> [<case>]`; failures
    /// carry what the provider did, not-run checks are skipped with the reason, known defects
    /// pass with the defect in `system-out`.
    pub fn to_junit(&self) -> String {
        let (_, fail, skip, _) = self.counts();
        let total: f64 = self.results.iter().map(|r| r.duration.as_secs_f64()).sum();
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuite name=\"ccm-conformance.{}\" tests=\"{}\" failures=\"{fail}\" skipped=\"{skip}\" time=\"{total:.3}\">",
            xml(&self.provider),
            self.results.len()
        );
        for r in &self.results {
            let _ = write!(
                x,
                "  <testcase classname=\"{}\" name=\"{} [{}]\" time=\"{:.3}\"",
                xml(&self.provider),
                r.rule.id,
                xml(&r.case),
                r.duration.as_secs_f64()
            );
            match &r.outcome {
                Outcome::Pass => x.push_str("/>\n"),
                Outcome::Fail { detail } => {
                    let _ = write!(
                        x,
                        ">\n    <failure message=\"{}\">rule: {}\n{}</failure>\n  </testcase>\n",
                        xml(detail),
                        xml(r.rule.text),
                        xml(detail)
                    );
                }
                Outcome::DefectFixed { defect } => {
                    let _ = write!(
                        x,
                        ">\n    <failure message=\"listed as a known defect but passes: {}\"/>\n  </testcase>\n",
                        xml(defect)
                    );
                }
                Outcome::NotRun { reason } => {
                    let _ = write!(
                        x,
                        ">\n    <skipped message=\"{}\"/>\n  </testcase>\n",
                        xml(reason)
                    );
                }
                Outcome::KnownDefect { defect, detail } => {
                    let _ = write!(
                        x,
                        ">\n    <system-out>known defect: {}\n{}</system-out>\n  </testcase>\n",
                        xml(defect),
                        xml(detail)
                    );
                }
            }
        }
        x.push_str("</testsuite>\n");
        x
    }

    /// One screen: a line per rule with its worst outcome, then each failure's detail.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "ccm conformance: provider {}, {} level, cluster {}\n\n",
            self.provider, self.level, self.cluster
        );
        for rule in crate::rules::ALL.iter().chain(crate::rules::CLUSTER) {
            let rs: Vec<&CheckResult> = self.of(rule.id).collect();
            if rs.is_empty() {
                continue;
            }
            // Checks that did not run never hide the outcome of those that did.
            let worst = rs
                .iter()
                .map(|r| &r.outcome)
                .max_by_key(|o| severity(o))
                .expect("non-empty");
            let not_run = rs
                .iter()
                .filter(|r| matches!(r.outcome, Outcome::NotRun { .. }))
                .count();
            let extra = if not_run > 0 && not_run < rs.len() {
                format!(", {not_run} not run")
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "  {:<26} {} ({} checks{extra})",
                worst.label(),
                rule.id,
                rs.len()
            );
        }
        let (pass, fail, not_run, known) = self.counts();
        let _ = writeln!(
            s,
            "\n{pass} passed, {fail} failed, {not_run} not run, {known} known defects"
        );
        for r in self
            .results
            .iter()
            .filter(|r| r.outcome.is_failure() || matches!(r.outcome, Outcome::KnownDefect { .. }))
        {
            let detail = match &r.outcome {
                Outcome::Fail { detail } | Outcome::KnownDefect { detail, .. } => detail.clone(),
                Outcome::DefectFixed { defect } => {
                    format!("passes, but the known-defect list still names: {defect}")
                }
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "  {} {} [{}]: {detail}\n      rule: {}",
                r.outcome.label(),
                r.rule.id,
                r.case,
                r.rule.text
            );
        }
        if self.interrupted {
            s.push_str("interrupted: not every check ran\n");
        }
        if !self.swept.is_empty() {
            let _ = writeln!(s, "swept: {}", self.swept.join(", "));
        }
        s
    }
}

fn severity(o: &Outcome) -> u8 {
    match o {
        Outcome::NotRun { .. } => 0,
        Outcome::Pass => 1,
        Outcome::KnownDefect { .. } => 2,
        Outcome::DefectFixed { .. } => 3,
        Outcome::Fail { .. } => 4,
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
