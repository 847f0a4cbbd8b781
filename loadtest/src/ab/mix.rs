//! The op mix of the A/B experiment: the seed's groups (prog+run, write+read, grant+revoke,
//! link+walk, seal, stats, audit), picked by weight; a group's rpcs run one after another and
//! each rpc is timed and counted on its own.

use std::fmt;

use anyhow::{Context, bail};
use rand::Rng;
use serde::Serialize;

/// One group of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Group {
    /// Prog at a fresh cell, then Run one of this user's program cells.
    ProgRun,
    /// Write a fresh cell, then Read one of this user's acknowledged cells.
    WriteRead,
    /// Grant READ to the run's spare key, then revoke it.
    GrantRevoke,
    /// Link the next edge of this user's chain, then Walk part of the chain.
    LinkWalk,
    /// Write a fresh cell, then Seal it.
    Seal,
    /// Tenant.Stats: the totals, or one of this user's program cells with its run count.
    Stats,
    /// Tenant.Audit with limit 100 from a random seq: the heavy op of the seed.
    Audit,
}

impl Group {
    pub const ALL: [Group; 7] = [
        Group::ProgRun,
        Group::WriteRead,
        Group::GrantRevoke,
        Group::LinkWalk,
        Group::Seal,
        Group::Stats,
        Group::Audit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Group::ProgRun => "prog-run",
            Group::WriteRead => "write-read",
            Group::GrantRevoke => "grant-revoke",
            Group::LinkWalk => "link-walk",
            Group::Seal => "seal",
            Group::Stats => "stats",
            Group::Audit => "audit",
        }
    }

    fn parse(s: &str) -> anyhow::Result<Group> {
        Group::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .with_context(|| {
                let names: Vec<_> = Group::ALL.iter().map(|g| g.name()).collect();
                format!("unknown op group {s:?}; known: {}", names.join(", "))
            })
    }
}

/// Weights of the groups: `audit` (the seed's mix, every group weight 1), `legacy` (the same
/// without audit, what the seed's users ran before audit existed), or `group=w,...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mix {
    pub name: String,
    pub weights: Vec<(Group, u32)>,
}

impl Mix {
    pub fn audit() -> Mix {
        Mix {
            name: "audit".into(),
            weights: Group::ALL.iter().map(|g| (*g, 1)).collect(),
        }
    }

    pub fn legacy() -> Mix {
        Mix {
            name: "legacy".into(),
            weights: Group::ALL
                .iter()
                .filter(|g| **g != Group::Audit)
                .map(|g| (*g, 1))
                .collect(),
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Mix> {
        match s {
            "audit" | "default" => return Ok(Mix::audit()),
            "legacy" => return Ok(Mix::legacy()),
            _ => {}
        }
        let mut weights = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (g, w) = part.split_once('=').with_context(|| {
                format!(
                    "mix entry {part:?} is not GROUP=WEIGHT (or give a whole mix: audit, \
                         legacy)"
                )
            })?;
            let g = Group::parse(g.trim())?;
            let w: u32 = w
                .trim()
                .parse()
                .with_context(|| format!("weight of {} is not a whole number", g.name()))?;
            if weights.iter().any(|(seen, _)| *seen == g) {
                bail!("op group {} is given twice", g.name());
            }
            if w > 0 {
                weights.push((g, w));
            }
        }
        if weights.is_empty() {
            bail!("the mix {s:?} has no group with a weight above 0");
        }
        // `pick` draws from their sum.
        if weights
            .iter()
            .try_fold(0u32, |sum, (_, w)| sum.checked_add(*w))
            .is_none()
        {
            bail!(
                "the weights of the mix {s:?} add up to more than {}: use smaller ones (only their ratios count)",
                u32::MAX
            );
        }
        weights.sort();
        Ok(Mix {
            name: s.into(),
            weights,
        })
    }

    pub fn pick(&self, rng: &mut impl Rng) -> Group {
        let total: u32 = self.weights.iter().map(|(_, w)| w).sum();
        let mut r = rng.gen_range(0..total);
        for (g, w) in &self.weights {
            if r < *w {
                return *g;
            }
            r -= w;
        }
        self.weights[0].0
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn named_mixes_differ_only_by_audit() {
        assert_eq!(Mix::audit().weights.len(), 7);
        assert!(
            Mix::legacy()
                .weights
                .iter()
                .all(|(g, _)| *g != Group::Audit)
        );
        assert_eq!(Mix::legacy().weights.len(), 6);
    }

    #[test]
    fn custom_weights_parse_and_bad_ones_say_why() {
        let m = Mix::parse("write-read=3, audit=1,seal=0").unwrap();
        assert_eq!(m.weights, vec![(Group::WriteRead, 3), (Group::Audit, 1)]);
        let e = Mix::parse("writes=1").unwrap_err().to_string();
        assert!(
            e.contains("unknown op group") && e.contains("write-read"),
            "{e}"
        );
        assert!(Mix::parse("seal=0").is_err());
        assert!(Mix::parse("seal=1,seal=2").is_err());
        assert!(Mix::parse("seal").is_err());
        // Weights whose sum overflows (it wrapped to 0, and `pick` panicked, or to 1, and
        // dropped a group from the mix).
        let e = Mix::parse("audit=4294967295,seal=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("add up to more than"), "{e}");
        assert!(Mix::parse("audit=4294967294,seal=1").is_ok());
    }

    #[test]
    fn picks_follow_the_weights() {
        let m = Mix::parse("write-read=3,audit=1").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let n = 40_000;
        let audits = (0..n).filter(|_| m.pick(&mut rng) == Group::Audit).count();
        let share = audits as f64 / n as f64;
        assert!((0.23..0.27).contains(&share), "audit share {share}");
    }
}
