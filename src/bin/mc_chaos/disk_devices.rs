//! Real block devices under the owners' SSD tiers, for the disk faults a file cannot fake:
//! each tier directory is an ext4 filesystem on its own loop device (a sparse image of
//! [`IMAGE_BYTES`] in the run's `disk-images/`), so
//!
//! - **`disk_full`** fills that filesystem with a ballast file (`fallocate`: the owner's
//!   `statvfs` sees it full and refuses demotions) for the fault's window, then deletes it;
//! - **`disk_slow`** throttles every read and write of that loop device (the kernel's blkio
//!   throttling, cgroup v1 root group: only the tier's I/O goes through the device) to
//!   [`SLOW_BPS`] and [`SLOW_IOPS`] for the window, then lifts it;
//! - **`disk_eio`** shuts that filesystem down as a dying disk does (`EXT4_IOC_SHUTDOWN`
//!   without a journal flush: from then on every read, write, open and fsync on it fails with
//!   `EIO`, and what was not yet committed is lost) for the window; a shut-down filesystem
//!   stays dead while any file of it is open, so the window ends as an operator's repair:
//!   the owner is killed, the device unmounted and mounted again (journal replay), and the
//!   owner restarted on it ([`LoopTiers::shut_down`], [`LoopTiers::remount`]).
//!
//! Needs root, `losetup`, `mkfs.ext4`, `mount` and the blkio controller at
//! [`BLKIO`]; [`LoopTiers::create`] says why when they cannot be had, and the soak then skips
//! both faults (printing that reason) with plain directories as tiers. Owned by the fault
//! driver (single thread); dropping it lifts any throttle, unmounts (lazily: an owner killed
//! last may still hold files) and detaches the devices.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The disk fault kinds that need [`LoopTiers`].
pub const DEVICE_KINDS: &[&str] = &["disk_full", "disk_slow", "disk_eio"];

/// Size of each tier's filesystem image: above the tier's 64 MiB free-space reserve
/// (`src/storage/disk`) plus room for records, so only the ballast makes it full.
const IMAGE_BYTES: u64 = 160 << 20;
/// Bytes per second each way while `disk_slow` lasts.
const SLOW_BPS: u64 = 2 << 20;
/// I/O operations per second each way while `disk_slow` lasts.
const SLOW_IOPS: u64 = 40;
/// `EXT4_IOC_SHUTDOWN` (`_IOR('X', 125, __u32)`, linux/fs/ext4/ext4.h; the same number as
/// XFS's `XFS_IOC_GOINGDOWN`).
const EXT4_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587D;
/// `EXT4_GOING_FLAGS_NOLOGFLUSH`: stop at once, without committing the journal (a sudden
/// disk death: only what was synced survives).
const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;
/// The cgroup v1 blkio root (its throttle files take `MAJ:MIN VALUE` lines).
const BLKIO: &str = "/sys/fs/cgroup/blkio";
const THROTTLES: [&str; 4] = [
    "blkio.throttle.read_bps_device",
    "blkio.throttle.write_bps_device",
    "blkio.throttle.read_iops_device",
    "blkio.throttle.write_iops_device",
];

/// One tier's device: its image, loop device (`/dev/loopN`, `MAJ:MIN`) and mount point.
struct LoopTier {
    image: PathBuf,
    device: String,
    numbers: String,
    mount: PathBuf,
}

/// The loop-mounted tiers of every owner (index = owner index).
pub struct LoopTiers {
    tiers: Vec<LoopTier>,
}

/// Runs `program ARGS`; returns its stdout, the error names the command and its stderr.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command}: {e}"))?;
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
        false => Err(format!(
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl LoopTier {
    /// Makes `mount` (created if missing) an ext4 on a fresh loop device over `image`.
    /// Errors: why not; whatever was made is removed again.
    fn create(image: PathBuf, mount: &Path) -> Result<LoopTier, String> {
        let file = std::fs::File::create(&image).map_err(|e| format!("{image:?}: {e}"))?;
        file.set_len(IMAGE_BYTES)
            .map_err(|e| format!("{image:?}: {e}"))?;
        let image_arg = image.display().to_string();
        let made = run("mkfs.ext4", &["-q", "-F", &image_arg])
            .and_then(|_| run("losetup", &["-f", "--show", &image_arg]));
        let device = made.inspect_err(|_| {
            let _ = std::fs::remove_file(&image);
        })?;
        let mut tier = LoopTier {
            image,
            numbers: String::new(),
            device,
            mount: mount.to_path_buf(),
        };
        // From here on, dropping `tier` undoes what was made.
        std::fs::create_dir_all(mount).map_err(|e| format!("{mount:?}: {e}"))?;
        tier.numbers = run("lsblk", &["-dno", "MAJ:MIN", &tier.device])?;
        run("mount", &[&tier.device, &mount.display().to_string()])?;
        Ok(tier)
    }

    /// Shuts this tier's filesystem down: every later operation on it fails with `EIO`.
    fn shut_down(&self) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let dir = std::fs::File::open(&self.mount).map_err(|e| format!("{:?}: {e}", self.mount))?;
        let mut flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
        // SAFETY: the ioctl reads one u32 through the pointer, which outlives the call; `dir`
        // is an open descriptor of the mount point.
        let rc = unsafe { libc::ioctl(dir.as_raw_fd(), EXT4_IOC_SHUTDOWN as _, &mut flags) };
        match rc {
            0 => Ok(()),
            _ => Err(format!(
                "EXT4_IOC_SHUTDOWN {}: {}",
                self.device,
                std::io::Error::last_os_error()
            )),
        }
    }

    /// Unmounts this tier's filesystem and mounts it again (the journal replays). Errors: the
    /// unmount failed (a process still holds a file of it) or the mount did.
    fn remount(&self) -> Result<(), String> {
        let mount = self.mount.display().to_string();
        run("umount", &[&mount])?;
        run("mount", &[&self.device, &mount]).map(|_| ())
    }

    /// Writes `value` for this device into every blkio throttle file (0 lifts the limit).
    fn throttle(&self, bps: u64, iops: u64) -> Result<(), String> {
        for (file, value) in THROTTLES.iter().zip([bps, bps, iops, iops]) {
            let path = Path::new(BLKIO).join(file);
            std::fs::write(&path, format!("{} {value}\n", self.numbers))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(())
    }
}

impl Drop for LoopTier {
    fn drop(&mut self) {
        let _ = self.throttle(0, 0);
        let _ = run("umount", &["-l", &self.mount.display().to_string()]);
        let _ = run("losetup", &["-d", &self.device]);
        let _ = std::fs::remove_file(&self.image);
    }
}

impl LoopTiers {
    /// Mounts a loop-device ext4 at each of `mounts` (images next to them). Errors: why not
    /// (not root, a tool or the blkio controller missing, the kernel refused); whatever was
    /// made is removed again.
    pub fn create(mounts: &[PathBuf]) -> Result<LoopTiers, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root".into());
        }
        if !Path::new(BLKIO).join(THROTTLES[0]).exists() {
            return Err(format!("no blkio throttling at {BLKIO}"));
        }
        let mut tiers = Vec::new();
        for mount in mounts {
            // Next to the tiers, in a directory of their own (the run's files are journals).
            let images = mount.parent().unwrap_or(Path::new(".")).join("disk-images");
            std::fs::create_dir_all(&images).map_err(|e| format!("{images:?}: {e}"))?;
            let name = mount.file_name().unwrap_or_default().to_string_lossy();
            tiers.push(LoopTier::create(images.join(format!("{name}.img")), mount)?);
        }
        Ok(LoopTiers { tiers })
    }

    /// Fills tier `index`'s filesystem for `window`, then frees it again; returns the fault's
    /// target.
    pub fn fill(&self, index: usize, window: std::time::Duration) -> Result<String, String> {
        let tier = &self.tiers[index];
        let ballast = tier.mount.join("ballast");
        let free = run(
            "df",
            &["--output=avail", "-B1", &tier.mount.display().to_string()],
        )?;
        let free: u64 = free
            .lines()
            .last()
            .unwrap_or("0")
            .trim()
            .parse()
            .unwrap_or(0);
        let filled = run(
            "fallocate",
            &["-l", &free.to_string(), &ballast.display().to_string()],
        )
        .or_else(|_| {
            // fallocate fails when metadata takes some of `free`: take what it can give.
            let less = free.saturating_sub(4 << 20).to_string();
            run("fallocate", &["-l", &less, &ballast.display().to_string()])
        });
        std::thread::sleep(window);
        let _ = std::fs::remove_file(&ballast);
        filled.map(|_| tier.device.clone())
    }

    /// Shuts tier `index`'s filesystem down (every operation on it fails with `EIO` from now
    /// on); returns the fault's target. The owner of the tier must be stopped before
    /// [`LoopTiers::remount`] can bring it back.
    pub fn shut_down(&self, index: usize) -> Result<String, String> {
        let tier = &self.tiers[index];
        tier.shut_down().map(|()| tier.device.clone())
    }

    /// Brings tier `index` back after [`LoopTiers::shut_down`]: unmounts and mounts it again.
    /// Errors: a process still holds one of its files, or the mount failed.
    pub fn remount(&self, index: usize) -> Result<(), String> {
        self.tiers[index].remount()
    }

    /// Throttles tier `index`'s device for `window`, then lifts it; returns the fault's target.
    pub fn slow(&self, index: usize, window: std::time::Duration) -> Result<String, String> {
        let tier = &self.tiers[index];
        let throttled = tier.throttle(SLOW_BPS, SLOW_IOPS);
        std::thread::sleep(window);
        tier.throttle(0, 0)?;
        throttled.map(|()| tier.device.clone())
    }
}
