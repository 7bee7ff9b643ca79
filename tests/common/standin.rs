//! Stand-in driver harness shared by `tests/device_standin.rs` and `tests/stream_standin.rs`:
//! builds the test-only driver libraries of `tests/standin/` with `cc`, re-runs the current
//! test binary on one `child_*` test with the stand-in on `LD_LIBRARY_PATH`, and offers the
//! child-side helpers (device buffers, stand-in counters, clients).

use mooncake_rs::client::{Buf, Client, SetupConfig};
use mooncake_rs::device::{memcpy_safe, DeviceAlloc};
use mooncake_rs::master::{MasterConfig, MasterService};
use mooncake_rs::rpc::RpcServer;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------- parent side

/// Compiles `tests/standin/<source>` into `<tmp>/standin-<variant>/<lib>` (once per process)
/// and returns the folder. The library is written under a temporary name and renamed into
/// place, so a child of a concurrent test that is loading the previous build never sees a
/// half-written file.
pub fn build(source: &str, lib: &str, variant: &str, defines: &[&str]) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("standin-{variant}"));
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|v| v == variant) {
        return dir;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/standin")
        .join(source);
    let partial = dir.join(format!(".{lib}.{}", std::process::id()));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&partial)
        .arg(&src)
        .args(defines)
        .status()
        .expect("a C compiler (cc) is needed to build the stand-in driver");
    assert!(status.success(), "building {source} failed");
    std::fs::rename(&partial, dir.join(lib)).unwrap();
    built.push(variant.to_string());
    dir
}

/// The CUDA stand-in with every symbol.
pub fn cuda() -> PathBuf {
    build("cuda_standin.c", "libcuda.so", "cuda", &[])
}

/// The Ascend stand-in with every symbol.
pub fn ascend() -> PathBuf {
    build("ascend_standin.c", "libascendcl.so", "ascend", &[])
}

/// Runs `child_<name>` of this test binary in a fresh process with `libdir` on the loader
/// path; asserts it passed and returns its stderr.
pub fn child(name: &str, libdir: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            &format!("child_{name}"),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", libdir)
        .env("MC_LOG", "info")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child {name} failed ({:?}):\n{stdout}\n{stderr}",
        out.status
    );
    stderr.into_owned()
}

// ---------------------------------------------------------------- child side

/// Device memory holding `data`.
pub fn device_with(data: &[u8]) -> DeviceAlloc {
    let d = DeviceAlloc::new(data.len()).expect("device allocation");
    // SAFETY: both ranges are `data.len()` bytes.
    unsafe { memcpy_safe(d.addr() as *mut u8, data.as_ptr(), data.len()) }.unwrap();
    d
}

/// The bytes of device memory.
pub fn read_device(d: &DeviceAlloc) -> Vec<u8> {
    let mut out = vec![0u8; d.len()];
    // SAFETY: both ranges are `d.len()` bytes.
    unsafe { memcpy_safe(out.as_mut_ptr(), d.addr() as *const u8, d.len()) }.unwrap();
    out
}

/// The whole of `d` as a buffer.
pub fn buf(d: &DeviceAlloc) -> Buf {
    Buf::new(d.addr(), d.len() as u64)
}

/// The address of `name` in the already loaded library `lib` (`None` when it is not loaded,
/// e.g. under a real driver with another file name, or has no such symbol).
pub fn standin_symbol(lib: &CStr, name: &CStr) -> Option<*mut std::ffi::c_void> {
    // SAFETY: only looks up an already loaded library (RTLD_NOLOAD) and a symbol address.
    unsafe {
        let handle = libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if handle.is_null() {
            return None;
        }
        let sym = libc::dlsym(handle, name.as_ptr());
        libc::dlclose(handle);
        (!sym.is_null()).then_some(sym)
    }
}

/// A counter (`unsigned long`) exported by the loaded stand-in (`None` under a real driver).
pub fn standin_counter(lib: &CStr, name: &CStr) -> Option<u64> {
    // SAFETY: the stand-in's counters are `unsigned long`s that live as long as the library,
    // which stays loaded (the device runtime holds it).
    standin_symbol(lib, name).map(|sym| unsafe { *(sym as *const u64) })
}

/// An embedded client (in-process master, no sockets).
pub fn embedded(segment: u64, local_buffer: u64) -> Client {
    Client::setup(SetupConfig {
        local_hostname: "standin".into(),
        global_segment_size: segment,
        local_buffer_size: local_buffer,
        master_server_addr: "embedded".into(),
        ..SetupConfig::default()
    })
    .unwrap()
}

/// A master served over TCP on 127.0.0.1 (stopped on drop) for clients in this process.
pub struct TcpMaster {
    rpc: RpcServer,
}

impl TcpMaster {
    pub fn start() -> TcpMaster {
        let service = MasterService::new(MasterConfig::default());
        let rpc =
            mooncake_rs::master::remote::serve("127.0.0.1:0".parse().unwrap(), service).unwrap();
        TcpMaster { rpc }
    }

    /// A restart in place: the master (and everything it knew) is gone, a fresh one serves
    /// the same address; its clients get `NeedRemount` at their next ping.
    pub fn restart(&mut self) {
        let addr = self.rpc.local_addr();
        self.rpc.shutdown();
        let service = MasterService::new(MasterConfig::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        self.rpc = loop {
            match mooncake_rs::master::remote::serve(addr, service.clone()) {
                Ok(rpc) => break rpc,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("could not serve {addr} again: {e:?}"),
            }
        };
    }

    /// A client of this master over TCP with a `segment`-byte segment and no local buffer.
    pub fn client(&self, segment: u64) -> Client {
        self.client_with(
            segment,
            SetupConfig {
                local_hostname: "127.0.0.1".into(),
                ..SetupConfig::default()
            },
        )
    }

    /// As [`TcpMaster::client`], over RDMA on `device` with data address `host` (inside
    /// the soft-RoCE VM: `RDMA_VM_DEV`, `RDMA_VM_ADDR`).
    pub fn rdma_client(&self, segment: u64, device: &str, host: &str) -> Client {
        self.client_with(
            segment,
            SetupConfig {
                local_hostname: host.into(),
                protocol: "rdma".into(),
                device_name: device.into(),
                ..SetupConfig::default()
            },
        )
    }

    fn client_with(&self, segment: u64, base: SetupConfig) -> Client {
        Client::setup(SetupConfig {
            global_segment_size: segment,
            local_buffer_size: 0,
            master_server_addr: self.rpc.local_addr().to_string(),
            ..base
        })
        .unwrap()
    }
}
