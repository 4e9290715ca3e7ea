//! Redis for tests: a standalone server and a three-master Redis Cluster.
//!
//! Each comes from its environment variable when set (scripts/test starts
//! them once for the whole run), else is started lazily once per test
//! process. Tests share them and keep apart by using `unique_prefix()` in
//! their keys and channel names.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use super::process::{self, StartError};

const STANDALONE_ENV: &str = "TETHER_TEST_REDIS_URL";
const CLUSTER_ENV: &str = "TETHER_TEST_REDIS_CLUSTER";

/// A standalone Redis as `redis://127.0.0.1:PORT`.
pub fn redis_url() -> String {
    if let Some(url) = non_empty_env(STANDALONE_ENV) {
        return url;
    }
    static STANDALONE: OnceLock<Result<String, String>> = OnceLock::new();
    STANDALONE.get_or_init(start_standalone).clone().unwrap_or_else(|message| panic!("{message}"))
}

/// The three masters of a Redis Cluster as `127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`.
pub fn redis_cluster_nodes() -> String {
    if let Some(nodes) = non_empty_env(CLUSTER_ENV) {
        return nodes;
    }
    static CLUSTER: OnceLock<Result<String, String>> = OnceLock::new();
    CLUSTER.get_or_init(start_cluster).clone().unwrap_or_else(|message| panic!("{message}"))
}

/// `redis_cluster_nodes()` as (host, port) pairs, the shape
/// `fred::types::config::ServerConfig::new_clustered` takes.
pub fn redis_cluster_hosts() -> Vec<(String, u16)> {
    redis_cluster_nodes()
        .split(',')
        .map(|node| {
            let (host, port) =
                node.trim().rsplit_once(':').unwrap_or_else(|| panic!("cluster node {node:?} is not HOST:PORT"));
            let port = port.parse().unwrap_or_else(|e| panic!("cluster node {node:?} has a bad port: {e}"));
            (host.to_string(), port)
        })
        .collect()
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

fn start_standalone() -> Result<String, String> {
    let started = Instant::now();
    let dir = process::scratch_dir("redis", None);
    let mut last_error = String::new();
    for _attempt in 0..3 {
        let port = process::free_port();
        match start_node(&dir, port, false) {
            Ok(child) => {
                process::stop_at_exit(child, libc::SIGKILL);
                eprintln!("tests/support: redis on 127.0.0.1:{port} ready in {:.1?}", started.elapsed());
                return Ok(format!("redis://127.0.0.1:{port}"));
            }
            Err(StartError::PortTaken(message)) => last_error = message,
            Err(StartError::Failed(message)) => return Err(message),
        }
    }
    Err(last_error)
}

/// A standalone Redis of one test's own, which the test may restart (on
/// the same port, with nothing kept: pub/sub state is gone, as after a real
/// restart).
pub struct OwnRedis {
    dir: std::path::PathBuf,
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    pub fn start() -> OwnRedis {
        let dir = process::scratch_dir("own-redis", None);
        for _attempt in 0..3 {
            let port = process::free_port();
            match start_node(&dir, port, false) {
                Ok(child) => return OwnRedis { dir, port, child: Some(child) },
                Err(StartError::PortTaken(_)) => continue,
                Err(StartError::Failed(message)) => panic!("{message}"),
            }
        }
        panic!("no free port for a redis-server");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// SIGKILLs the server.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops (SIGSTOP) the server: its connections stay open and nothing
    /// it is sent is answered until [`Self::resume`].
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: i32) {
        let child = self.child.as_ref().expect("a running redis-server");
        let pid = i32::try_from(child.id()).expect("pid");
        // SAFETY: kill(2) with the pid of a child this value owns and waits for.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to redis-server");
    }

    /// Starts it again on the same port.
    pub fn start_again(&mut self) {
        self.kill();
        let child = start_node(&self.dir, self.port, false).unwrap_or_else(|e| match e {
            StartError::PortTaken(m) | StartError::Failed(m) => panic!("restart redis: {m}"),
        });
        self.child = Some(child);
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts one redis-server on `port` (a cluster node if `cluster`) and waits
/// until it answers PING.
fn start_node(dir: &Path, port: u16, cluster: bool) -> Result<Child, StartError> {
    let redis_server = process::require_binary("redis-server", "redis-server");
    let log = dir.join(format!("redis-{port}.log"));
    let (out, err) = process::log_file(&log);
    let mut command = Command::new(redis_server);
    command
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    if cluster {
        command
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", "5000"]);
    }
    let mut child =
        process::spawn_tied(command, None).map_err(|e| StartError::Failed(format!("spawn redis-server: {e}")))?;
    let ready = process::wait_until_ready("redis-server", &mut child, &log, Duration::from_secs(30), || {
        process::redis_command(port, &["PING"]).is_ok_and(|reply| reply == "PONG")
    });
    match ready {
        Ok(()) => Ok(child),
        Err(error) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(error)
        }
    }
}

fn start_cluster() -> Result<String, String> {
    let started = Instant::now();
    let (addresses, nodes) = start_cluster_nodes("redis-cluster")?;
    for node in nodes {
        process::stop_at_exit(node, libc::SIGKILL);
    }
    eprintln!("tests/support: Redis Cluster {} ready in {:.1?}", addresses.join(","), started.elapsed());
    Ok(addresses.join(","))
}

/// Starts three cluster nodes on free ports and joins them into a cluster
/// whose slots are all served; returns their addresses and processes.
fn start_cluster_nodes(scratch: &str) -> Result<(Vec<String>, Vec<Child>), String> {
    let redis_cli = process::require_binary("redis-cli", "redis-tools");
    let dir = process::scratch_dir(scratch, None);
    let mut last_error = String::new();
    'attempt: for _attempt in 0..3 {
        let mut ports = Vec::new();
        while ports.len() < 3 {
            let port = process::free_cluster_port();
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
        let mut nodes = Vec::new();
        for &port in &ports {
            match start_node(&dir, port, true) {
                Ok(child) => nodes.push(child),
                Err(error) => {
                    for mut node in nodes {
                        let _ = node.kill();
                        let _ = node.wait();
                    }
                    match error {
                        StartError::PortTaken(message) => {
                            last_error = message;
                            continue 'attempt;
                        }
                        StartError::Failed(message) => return Err(message),
                    }
                }
            }
        }
        let addresses: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
        let joined = create_cluster(&redis_cli, &dir, &addresses).and_then(|()| wait_for_cluster_ok(&ports));
        if let Err(message) = joined {
            for mut node in nodes {
                let _ = node.kill();
                let _ = node.wait();
            }
            return Err(message);
        }
        return Ok((addresses, nodes));
    }
    Err(last_error)
}

/// A three-master Redis Cluster of one test's own, whose slots the test
/// may move between masters (a live slot migration), without disturbing
/// the cluster other tests share.
pub struct OwnRedisCluster {
    ports: Vec<u16>,
    nodes: Vec<Child>,
}

impl OwnRedisCluster {
    pub fn start() -> OwnRedisCluster {
        let (addresses, nodes) = start_cluster_nodes("own-redis-cluster").unwrap_or_else(|m| panic!("{m}"));
        let ports = addresses.iter().filter_map(|a| a.rsplit_once(':')?.1.parse().ok()).collect();
        OwnRedisCluster { ports, nodes }
    }

    /// The seeds, as `redis.cluster_nodes` takes them.
    pub fn nodes(&self) -> String {
        self.ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// The masters' ports.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    /// The port of the master that serves `slot`.
    pub fn owner(&self, slot: u16) -> u16 {
        self.masters(slot).into_iter().find(|m| m.2).map(|m| m.1).expect("the slot's owner")
    }

    /// Stops (SIGSTOP) the node on `port`: its connections stay open and
    /// nothing it is sent is answered until [`Self::resume`].
    pub fn pause(&self, port: u16) {
        self.signal(port, libc::SIGSTOP);
    }

    pub fn resume(&self, port: u16) {
        self.signal(port, libc::SIGCONT);
    }

    fn signal(&self, port: u16, signal: i32) {
        let at = self.ports.iter().position(|p| *p == port).expect("a node of this cluster");
        let pid = i32::try_from(self.nodes[at].id()).expect("pid");
        // SAFETY: kill(2) with the pid of a child this value owns and waits for.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to the node on {port}");
    }

    /// (node id, port, owns `slot`) of every master, from CLUSTER NODES.
    fn masters(&self, slot: u16) -> Vec<(String, u16, bool)> {
        let nodes = process::redis_command(self.ports[0], &["CLUSTER", "NODES"]).expect("CLUSTER NODES");
        nodes
            .lines()
            .filter(|line| line.contains("master"))
            .map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port = fields[1].split(['@', ':']).nth(1).and_then(|p| p.parse().ok()).expect("node port");
                let owns = fields[8..].iter().any(|range| {
                    let (start, end) = range.split_once('-').unwrap_or((range, range));
                    matches!((start.parse::<u16>(), end.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
                });
                (fields[0].to_string(), port, owns)
            })
            .collect()
    }

    /// Moves `slot` (which must hold no keys: pub/sub only) from its owner
    /// to another master, the way a resharding tool does, and returns the
    /// new owner's port. The old owner then drops the slot's shard
    /// subscriptions with an unsolicited SUNSUBSCRIBE.
    pub fn migrate_slot(&self, slot: u16) -> u16 {
        let masters = self.masters(slot);
        let (source_id, source_port, _) = masters.iter().find(|m| m.2).cloned().expect("the slot's owner");
        let (target_id, target_port, _) = masters.iter().find(|m| !m.2).cloned().expect("another master");
        let slot = slot.to_string();
        let run = |port: u16, args: &[&str]| {
            let reply = process::redis_command(port, args).unwrap_or_else(|e| panic!("{args:?} on {port}: {e}"));
            assert!(!reply.starts_with('-'), "{args:?} on {port}: {reply}");
        };
        run(target_port, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
        run(source_port, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
        run(target_port, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        run(source_port, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        for (_, port, _) in masters.iter().filter(|m| m.1 != source_port && m.1 != target_port) {
            run(*port, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        }
        target_port
    }
}

impl Drop for OwnRedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

/// A command's counters in `INFO commandstats` of the Redis on `port`:
/// (calls, rejected_calls), both 0 for a command it has not seen.
pub fn command_stats(port: u16, command: &str) -> (u64, u64) {
    let stats = process::redis_command(port, &["INFO", "commandstats"]).expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = stats.lines().find_map(|line| line.strip_prefix(prefix.as_str())) else { return (0, 0) };
    let field = |name: &str| {
        line.split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    (field("calls"), field("rejected_calls"))
}

/// `redis-cli --cluster create`: assigns the slots and joins the nodes.
fn create_cluster(redis_cli: &Path, dir: &Path, addresses: &[String]) -> Result<(), String> {
    let log = dir.join("cluster-create.log");
    let (out, err) = process::log_file(&log);
    let mut command = Command::new(redis_cli);
    command
        .args(["--cluster", "create"])
        .args(addresses)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    let mut child = process::spawn_tied(command, None).map_err(|e| format!("spawn redis-cli: {e}"))?;
    match process::wait_timeout(&mut child, Duration::from_secs(60)) {
        Some(status) if status.success() => Ok(()),
        outcome => {
            let _ = child.kill();
            let _ = child.wait();
            Err(format!(
                "redis-cli --cluster create {} failed ({outcome:?}); its output:\n{}",
                addresses.join(" "),
                process::read_log(&log)
            ))
        }
    }
}

/// Waits until every node reports `cluster_state:ok`, all 16384 slots
/// assigned and served, and knows all three masters.
fn wait_for_cluster_ok(ports: &[u16]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last_info = String::new();
    loop {
        let mut all_ok = true;
        for &port in ports {
            let info = process::redis_command(port, &["CLUSTER", "INFO"]).unwrap_or_else(|e| e.to_string());
            let ok = info.contains("cluster_state:ok")
                && info.contains("cluster_slots_assigned:16384")
                && info.contains("cluster_slots_ok:16384")
                && info.contains(&format!("cluster_known_nodes:{}", ports.len()));
            if !ok {
                all_ok = false;
                last_info = format!("127.0.0.1:{port} says:\n{info}");
                break;
            }
        }
        if all_ok {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("Redis Cluster not ok after 30 s; {last_info}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
