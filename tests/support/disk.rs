//! A full disk under a server's SQLite file, two ways:
//!
//! - [`SmallDisk`]: a small tmpfs mounted for the test (root only, and only
//!   where mounting is allowed: some containers refuse it), filled to the
//!   brim with a ballast file, so writes fail with ENOSPC as on a real full
//!   disk; removing the ballast frees the space;
//! - [`limit_file_size`]: a file-size limit on the server process
//!   (RLIMIT_FSIZE, what `ulimit -f` or systemd's `LimitFSIZE=` set), which
//!   fails writes past it with EFBIG; works unprivileged, and lifting the
//!   limit frees the space.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A 4 MiB tmpfs mounted on a fresh directory; unmounted on drop.
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts the tmpfs, or says why it could not.
    pub fn mount() -> Result<SmallDisk, String> {
        let dir = tempfile::Builder::new().prefix("tether-small-disk-").tempdir().map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("run mount: {e}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).trim().to_string());
        }
        Ok(SmallDisk { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn ballast(&self) -> PathBuf {
        self.dir.path().join("ballast")
    }

    /// Fills every free byte with a ballast file.
    pub fn fill(&self) {
        let mut file = fs::File::create(self.ballast()).expect("create the ballast");
        let block = vec![0u8; 64 * 1024];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("write the ballast: {e}"),
            }
        }
        // Whatever a partial block left.
        while file.write(&[0u8]).is_ok_and(|n| n == 1) {}
    }

    /// Removes the ballast: the space is free again.
    pub fn free(&self) {
        fs::remove_file(self.ballast()).expect("remove the ballast");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: a process that still has a file open there cannot block it.
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Sets the soft file-size limit (RLIMIT_FSIZE) of process `pid` to `bytes`,
/// or lifts it (back to the hard limit) with `None`.
pub fn limit_file_size(pid: u32, bytes: Option<u64>) {
    let mut current = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit(2) reads the limit of `pid` into `current`.
    let read = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_FSIZE, std::ptr::null(), &mut current) };
    assert_eq!(read, 0, "read RLIMIT_FSIZE of {pid}: {}", std::io::Error::last_os_error());
    let wanted = libc::rlimit { rlim_cur: bytes.unwrap_or(current.rlim_max), rlim_max: current.rlim_max };
    // SAFETY: prlimit(2) sets the limit of `pid` from `wanted`.
    let set = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_FSIZE, &wanted, std::ptr::null_mut()) };
    assert_eq!(set, 0, "set RLIMIT_FSIZE of {pid}: {}", std::io::Error::last_os_error());
}
