//! The host's resource limits, answered to LimitsRefresh (docs/REST.md,
//! "Daemon requests").
//!
//! The JSON shape is part of the protocol and documented in
//! docs/PROTOCOL.md ("LimitsResult.limits_json"); keep the two in step.

use serde::Serialize;

/// One `getrlimit` pair; `None` (JSON null) means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Rlimit {
    pub soft: Option<u64>,
    pub hard: Option<u64>,
}

/// The rlimits the daemon (and so every terminal it starts) runs under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rlimits {
    /// Open files.
    pub nofile: Rlimit,
    /// Processes of this user.
    pub nproc: Rlimit,
    /// Address space, bytes.
    #[serde(rename = "as")]
    pub address_space: Rlimit,
    /// CPU time, seconds.
    pub cpu: Rlimit,
}

/// The payload of `LimitsResult.limits_json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HostLimits {
    pub rlimits: Rlimits,
    /// CPUs this process may use (affinity and cgroup quota applied).
    pub cpus: Option<u64>,
    /// `MemTotal` from /proc/meminfo; null where there is no such file.
    pub mem_total_kb: Option<u64>,
}

impl HostLimits {
    /// Reads the current limits of this process and machine.
    pub fn collect() -> Self {
        Self {
            rlimits: Rlimits {
                nofile: rlimit(libc::RLIMIT_NOFILE),
                nproc: rlimit(libc::RLIMIT_NPROC),
                address_space: rlimit(libc::RLIMIT_AS),
                cpu: rlimit(libc::RLIMIT_CPU),
            },
            cpus: std::thread::available_parallelism().ok().and_then(|n| u64::try_from(n.get()).ok()),
            mem_total_kb: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|meminfo| parse_mem_total_kb(&meminfo)),
        }
    }

    pub fn to_json(&self) -> String {
        // Serializing plain structs of numbers cannot fail; fall back to an
        // empty object rather than carrying an impossible error around.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(any(target_os = "linux", target_os = "android")))]
type Resource = libc::c_int;

fn rlimit(resource: Resource) -> Rlimit {
    let mut raw = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct we pass.
    if unsafe { libc::getrlimit(resource, &mut raw) } != 0 {
        return Rlimit { soft: None, hard: None };
    }
    Rlimit { soft: rlimit_value(raw.rlim_cur), hard: rlimit_value(raw.rlim_max) }
}

// rlim_t is u64 on Linux but not on every unix.
#[allow(clippy::useless_conversion)]
fn rlimit_value(raw: libc::rlim_t) -> Option<u64> {
    if raw == libc::RLIM_INFINITY {
        None
    } else {
        u64::try_from(raw).ok()
    }
}

fn parse_mem_total_kb(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let value = line.strip_prefix("MemTotal:")?.trim();
        value.strip_suffix("kB").unwrap_or(value).trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_from_meminfo() {
        let meminfo = "MemFree:  100 kB\nMemTotal:       16303428 kB\nBuffers: 1 kB\n";
        assert_eq!(parse_mem_total_kb(meminfo), Some(16_303_428));
        assert_eq!(parse_mem_total_kb("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn infinity_becomes_null() {
        assert_eq!(rlimit_value(libc::RLIM_INFINITY), None);
        assert_eq!(rlimit_value(1024), Some(1024));
    }

    #[test]
    fn json_shape_matches_the_protocol_doc() {
        let limits = HostLimits {
            rlimits: Rlimits {
                nofile: Rlimit { soft: Some(1024), hard: Some(4096) },
                nproc: Rlimit { soft: None, hard: None },
                address_space: Rlimit { soft: None, hard: None },
                cpu: Rlimit { soft: Some(60), hard: None },
            },
            cpus: Some(2),
            mem_total_kb: Some(1000),
        };
        let json: serde_json::Value = serde_json::from_str(&limits.to_json()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "rlimits": {
                    "nofile": {"soft": 1024, "hard": 4096},
                    "nproc": {"soft": null, "hard": null},
                    "as": {"soft": null, "hard": null},
                    "cpu": {"soft": 60, "hard": null}
                },
                "cpus": 2,
                "memTotalKb": 1000
            })
        );
    }

    #[test]
    fn collected_limits_are_plausible() {
        let limits = HostLimits::collect();
        assert!(limits.cpus.unwrap_or(0) >= 1);
        assert!(limits.rlimits.nofile.soft.unwrap_or(u64::MAX) >= 1);
        if cfg!(target_os = "linux") {
            assert!(limits.mem_total_kb.unwrap_or(0) > 0);
        }
    }
}
