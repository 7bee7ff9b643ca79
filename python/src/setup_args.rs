//! The two forms of `setup` (spec §4.1): 13 positional/keyword arguments of upstream and `cluster_key_file` (the first seven
//! required), or one `dict` with string-parsed values (upstream's size and bool grammars).
//! pyo3 has no overloads, so `setup(*args, **kwargs)` is dispatched here by hand.

use crate::convert::U64;
use mooncake_rs::client::{ssd_offload_dir, SetupConfig};
use mooncake_rs::error::{fail, ErrorCode, Result};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Parameter names of the positional/keyword form, in order; the first seven are required.
const NAMES: [&str; 14] = [
    "local_hostname",
    "metadata_server",
    "global_segment_size",
    "local_buffer_size",
    "protocol",
    "rdma_devices",
    "master_server_addr",
    "engine",
    "enable_ssd_offload",
    "ssd_offload_path",
    "tenant_id",
    "enable_client_http_server",
    "client_http_port",
    "cluster_key_file",
];
const REQUIRED: usize = 7;
/// Default of the dict form's two sizes (16 MiB).
const DEFAULT_SIZE: u64 = 16 << 20;

/// What `setup` asks for, once its arguments are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupRequest {
    /// The client's own arguments.
    pub config: SetupConfig,
    /// Port of the client HTTP server (`/health`, `/metrics`), when enabled.
    pub http_port: Option<u16>,
}

/// Reads `setup`'s arguments. `Err(PyErr)` is a `TypeError`/`RuntimeError` to raise (wrong
/// types, unknown or missing names); `Ok(Err(code))` is a value error upstream reports as a
/// return code (-600, or -1012 for features not built).
pub fn parse(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<Result<SetupRequest>> {
    let kwargs = kwargs.filter(|k| !k.is_empty());
    if let Some(dict) = dict_form(args, kwargs)? {
        return Ok(from_dict(&dict));
    }
    let bound = bind(args, kwargs)?;
    let text = |i: usize| -> PyResult<String> {
        bound[i].as_ref().map_or(Ok(String::new()), |v| {
            v.extract::<String>().map_err(|_| {
                PyTypeError::new_err(format!("setup(): argument '{}' must be str", NAMES[i]))
            })
        })
    };
    let size = |i: usize| -> PyResult<u64> {
        bound[i].as_ref().map_or(Ok(0), |v| {
            v.extract::<U64>().map(|v| v.0).map_err(|_| {
                PyTypeError::new_err(format!(
                    "setup(): argument '{}' must be an int in [0, 2**64)",
                    NAMES[i]
                ))
            })
        })
    };
    let flag = |i: usize| -> PyResult<bool> {
        bound[i].as_ref().map_or(Ok(false), |v| {
            v.extract::<bool>().map_err(|_| {
                PyTypeError::new_err(format!("setup(): argument '{}' must be bool", NAMES[i]))
            })
        })
    };
    if let Some(engine) = bound[7].as_ref().filter(|e| !e.is_none()) {
        if !engine.is_instance_of::<crate::engine::PyTransferEngine>() {
            return Err(PyRuntimeError::new_err(
                "setup(): engine must be None or a mooncake.engine.TransferEngine",
            ));
        }
        tracing::warn!(
            "setup(): the store runs its own transfer engine; the TransferEngine given is not shared"
        );
    }
    let port = match &bound[12] {
        None => 9300,
        Some(v) => v.extract::<i64>().map_err(|_| {
            PyTypeError::new_err("setup(): argument 'client_http_port' must be int")
        })?,
    };
    let tenant = match &bound[10] {
        None => "default".to_string(),
        Some(_) => text(10)?,
    };
    let config = SetupConfig {
        local_hostname: text(0)?,
        metadata_server: text(1)?,
        global_segment_size: size(2)?,
        local_buffer_size: size(3)?,
        protocol: text(4)?,
        device_name: text(5)?,
        master_server_addr: text(6)?,
        ssd_offload_path: String::new(),
        cluster_key_file: text(13)?,
    };
    Ok(finish(
        config,
        Extras {
            ssd_offload: (flag(8)?, text(9)?),
            tenant,
            http_server: flag(11)?,
            http_port: port,
            ipc_socket_path: String::new(),
        },
    ))
}

/// The dict of the dict form, if this call uses it: one positional `dict`, or `config=`.
fn dict_form<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Option<Bound<'py, PyDict>>> {
    match (args.len(), kwargs) {
        (1, None) => Ok(args.get_item(0)?.cast_into::<PyDict>().ok()),
        (0, Some(k)) if k.len() == 1 => match k.get_item("config")? {
            Some(v) => v
                .cast_into::<PyDict>()
                .map(Some)
                .map_err(|_| PyTypeError::new_err("setup(): argument 'config' must be a dict")),
            None => Ok(None),
        },
        _ => Ok(None),
    }
}

/// Binds positional and keyword arguments to [`NAMES`], with Python's error messages.
fn bind<'py>(
    args: &Bound<'py, PyTuple>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    if args.len() > NAMES.len() {
        return Err(PyTypeError::new_err(format!(
            "setup() takes at most {} positional arguments ({} given)",
            NAMES.len(),
            args.len()
        )));
    }
    let mut bound: Vec<Option<Bound<'py, PyAny>>> = vec![None; NAMES.len()];
    for (i, v) in args.iter().enumerate() {
        bound[i] = Some(v);
    }
    if let Some(kwargs) = kwargs {
        for (k, v) in kwargs.iter() {
            let name: String = k.extract()?;
            let Some(i) = NAMES.iter().position(|n| *n == name) else {
                return Err(PyTypeError::new_err(format!(
                    "setup() got an unexpected keyword argument '{name}'"
                )));
            };
            if bound[i].is_some() {
                return Err(PyTypeError::new_err(format!(
                    "setup() got multiple values for argument '{name}'"
                )));
            }
            bound[i] = Some(v);
        }
    }
    if let Some(i) = (0..REQUIRED).find(|&i| bound[i].is_none()) {
        return Err(PyTypeError::new_err(format!(
            "setup() missing required argument '{}' (pos {})",
            NAMES[i],
            i + 1
        )));
    }
    Ok(bound)
}

/// Options of `setup` beyond the client's own arguments.
struct Extras {
    /// `enable_ssd_offload` and `ssd_offload_path`.
    ssd_offload: (bool, String),
    tenant: String,
    http_server: bool,
    http_port: i64,
    ipc_socket_path: String,
}

/// Resolves the SSD tier's directory; checks the options this library does not build and
/// the HTTP port.
fn finish(mut config: SetupConfig, extras: Extras) -> Result<SetupRequest> {
    let (enable, path) = &extras.ssd_offload;
    config.ssd_offload_path = ssd_offload_dir(*enable, path)?;
    if extras.tenant != "default" {
        return fail(
            ErrorCode::NotSupported,
            format!(
                "tenant_id '{}': tenants are not built in mooncake-rs (use \"default\")",
                extras.tenant
            ),
        );
    }
    if !extras.ipc_socket_path.is_empty() {
        return fail(
            ErrorCode::NotSupported,
            "ipc_socket_path: a Python store does not serve dummy clients; run `mooncake_client` \
             (it serves the dummies of its host on @mooncake_client_<port>.sock)",
        );
    }
    let http_port = match u16::try_from(extras.http_port) {
        Ok(p) if p != 0 => p,
        _ if !extras.http_server => 0,
        _ => {
            return fail(
                ErrorCode::InvalidParams,
                format!("client_http_port {} is outside 1..65535", extras.http_port),
            )
        }
    };
    Ok(SetupRequest {
        config,
        http_port: extras.http_server.then_some(http_port),
    })
}

/// The dict form: every key and value through `str()`, unknown keys ignored.
fn from_dict(dict: &Bound<'_, PyDict>) -> Result<SetupRequest> {
    let get = |key: &str| -> Option<String> {
        let value = dict.get_item(key).ok().flatten()?;
        value.str().ok().map(|s| s.to_string())
    };
    let required = |key: &str| -> Result<String> {
        match get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => fail(
                ErrorCode::InvalidParams,
                format!("setup(config): '{key}' is required"),
            ),
        }
    };
    let size = |key: &str| -> Result<u64> {
        match get(key) {
            None => Ok(DEFAULT_SIZE),
            Some(v) => parse_byte_size(&v).ok_or(()).or_else(|()| {
                fail(
                    ErrorCode::InvalidParams,
                    format!("setup(config): {key} '{v}' is not a size"),
                )
            }),
        }
    };
    let flag = |key: &str| get(key).is_some_and(|v| parse_bool(&v, false));
    let port = match get("client_http_port") {
        None => 9300,
        Some(v) => match v.trim().parse::<i64>() {
            Ok(p) => p,
            Err(_) => {
                return fail(
                    ErrorCode::InvalidParams,
                    format!("setup(config): client_http_port '{v}' is not an integer"),
                )
            }
        },
    };
    let config = SetupConfig {
        local_hostname: required("local_hostname")?,
        metadata_server: required("metadata_server")?,
        global_segment_size: size("global_segment_size")?,
        local_buffer_size: size("local_buffer_size")?,
        protocol: get("protocol").unwrap_or_else(|| "tcp".into()),
        device_name: get("rdma_devices").unwrap_or_default(),
        master_server_addr: get("master_server_addr").unwrap_or_else(|| "127.0.0.1:50051".into()),
        ssd_offload_path: String::new(),
        cluster_key_file: get("cluster_key_file").unwrap_or_default(),
    };
    finish(
        config,
        Extras {
            // LMCache names the directory `storage_root_dir`.
            ssd_offload: (
                flag("enable_ssd_offload"),
                get("ssd_offload_path")
                    .or_else(|| get("storage_root_dir"))
                    .unwrap_or_default(),
            ),
            tenant: get("tenant_id").unwrap_or_else(|| "default".into()),
            http_server: flag("enable_client_http_server"),
            http_port: port,
            ipc_socket_path: get("ipc_socket_path").unwrap_or_default(),
        },
    )
}

/// Upstream's `TryParseBool`: trimmed, case-insensitive `1/true/yes/on/enable` and
/// `0/false/no/off/disable`; anything else is `default` (with a warning).
pub fn parse_bool(text: &str, default: bool) -> bool {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" | "enable" => true,
        "0" | "false" | "no" | "off" | "disable" => false,
        other => {
            tracing::warn!("setup(config): '{other}' is not a bool; using {default}");
            default
        }
    }
}

/// Upstream's `try_string_to_byte_size` (spec §4.1): trim; `infinite` is 2**64-1; a leading
/// `strtod` number (decimals, exponents, hex; not negative); a unit `K/KB/M/MB/G/GB/T/TB`
/// (binary multiples, case-insensitive), `B` or nothing; truncated to an integer.
pub fn parse_byte_size(text: &str) -> Option<u64> {
    let text = text.trim_matches([' ', '\t', '\r', '\n']);
    if text == "infinite" {
        return Some(u64::MAX);
    }
    let (number, rest) = leading_number(text)?;
    if number.is_nan() || number < 0.0 {
        return None;
    }
    let shift = match rest.trim_start().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" => 10,
        "m" | "mb" => 20,
        "g" | "gb" => 30,
        "t" | "tb" => 40,
        _ => return None,
    };
    let bytes = number * (1u64 << shift) as f64;
    // `as` saturates: values beyond u64 become u64::MAX and fail the callers' range checks.
    Some(bytes as u64)
}

/// The longest prefix of `text` that C's `strtod` reads as a number, and what follows.
fn leading_number(text: &str) -> Option<(f64, &str)> {
    let bytes = text.as_bytes();
    let mut i = 0;
    if matches!(bytes.first(), Some(b'+' | b'-')) {
        i = 1;
    }
    let negative = bytes.first() == Some(&b'-');
    let body = &text[i..];
    if body.len() >= 2 && body[..2].eq_ignore_ascii_case("0x") {
        let digits = body[2..].bytes().take_while(u8::is_ascii_hexdigit).count();
        if digits > 0 {
            let value =
                u64::from_str_radix(&body[2..2 + digits], 16).map_or(f64::INFINITY, |v| v as f64);
            return Some((if negative { -value } else { value }, &body[2 + digits..]));
        }
    }
    let b = body.as_bytes();
    let mut j = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let int_digits = j;
    let mut frac_digits = 0;
    if b.get(j) == Some(&b'.') {
        frac_digits = b[j + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        j += 1 + frac_digits;
    }
    if int_digits + frac_digits == 0 {
        return None;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        let mut k = j + 1;
        if matches!(b.get(k), Some(b'+' | b'-')) {
            k += 1;
        }
        let exp_digits = b[k.min(b.len())..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if exp_digits > 0 {
            j = k + exp_digits;
        }
    }
    let value: f64 = body[..j].parse().ok()?;
    Some((if negative { -value } else { value }, &body[j..]))
}
