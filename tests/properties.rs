//! Property tests of the public decoders and parsers: the RPC frame codec, size strings, the
//! tiered-backend JSON, the P2P direction, percent coding and the HTTP server's request
//! reader. Each one: round trip where there is an encoder, never a panic on arbitrary input,
//! and bounded allocation on hostile lengths (measured by a counting allocator, per thread).
//! The private decoders (TCP transfer header and status frames, HTTP response parser) have
//! their properties next to them (src/transfer/wire.rs, src/rpc/http/client.rs).

use mooncake_rs::client::parse_size;
use mooncake_rs::master::{MasterRequest, MasterResponse};
use mooncake_rs::p2p::config::{TieredConfig, TransferDirection};
use mooncake_rs::rpc::codec::{
    decode_bounded, decode_payload, encode_frame, enum_result_error, error_frame, read_frame,
    read_frame_async, HEADER_LEN, MAX_FRAME_LEN,
};
use mooncake_rs::rpc::http::{percent_decode, percent_encode};
use mooncake_rs::rpc::{HttpHandler, HttpRequest, HttpResponse, HttpServer};
use mooncake_rs::types::{ReplicateConfig, Uuid};
use mooncake_rs::ErrorCode;
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

/// Counts the live bytes of the current thread and their peak, so a test can bound what one
/// call allocates.
struct CountingAlloc;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn account(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards every call to the system allocator unchanged; the counters are plain
// thread-local cells that never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        account(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Runs `f` and returns its result with the most bytes it had allocated at once on this
/// thread beyond what was live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - base).max(0) as usize)
}

/// What decoding at most `len` payload bytes may allocate: bincode preallocates at most a
/// bounded number of elements per declared sequence, and every declared sequence costs at
/// least one payload byte.
fn decode_budget(len: usize) -> usize {
    (len + 1) * 128 * 1024
}

fn batch_put_start(keys: Vec<String>, sizes: Vec<u64>, hi: u64, lo: u64) -> MasterRequest {
    MasterRequest::batch_put_start {
        client: Uuid { hi, lo },
        keys,
        sizes,
        config: ReplicateConfig::default(),
    }
}

/// A reader that hands out `data` and remembers the largest buffer it was asked to fill: a
/// frame reader that reserved what the header claims would be asked to fill that much.
struct WatchingReader<'a> {
    data: &'a [u8],
    largest_ask: usize,
}

impl Read for WatchingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.largest_ask = self.largest_ask.max(buf.len());
        self.data.read(buf)
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn rpc_frames_round_trip(
        keys in prop::collection::vec(".{0,40}", 0..20),
        sizes in prop::collection::vec(any::<u64>(), 0..20),
        hi in any::<u64>(),
        lo in any::<u64>(),
    ) {
        let request = batch_put_start(keys, sizes, hi, lo);
        let frame = encode_frame(&request).unwrap();
        prop_assert_eq!(
            u32::from_le_bytes(frame[..HEADER_LEN].try_into().unwrap()) as usize,
            frame.len() - HEADER_LEN
        );
        let payload = read_frame(&mut &frame[..]).unwrap();
        let decoded: MasterRequest = decode_payload(&payload).unwrap();
        prop_assert_eq!(format!("{decoded:?}"), format!("{request:?}"));
        let bounded: MasterRequest = decode_bounded(&payload, 1 << 20).unwrap();
        prop_assert_eq!(format!("{bounded:?}"), format!("{request:?}"));
        let async_payload = runtime().block_on(read_frame_async(&mut &frame[..])).unwrap();
        prop_assert_eq!(async_payload, Some(payload));
    }

    #[test]
    fn error_frames_round_trip_every_code(variant in 0u32..64, code in 0usize..ErrorCode::ALL.len()) {
        let code = ErrorCode::ALL[code];
        let request = encode_frame(&(variant,)).unwrap();
        if let Some(frame) = error_frame::<MasterResponse>(&request[HEADER_LEN..], code) {
            prop_assert_eq!(enum_result_error(&frame[HEADER_LEN..]), Some(code));
            prop_assert!(decode_payload::<MasterResponse>(&frame[HEADER_LEN..]).is_ok());
        }
    }

    #[test]
    fn rpc_payload_decoders_never_panic_and_allocate_boundedly(
        payload in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let budget = decode_budget(payload.len());
        let (_, peak) = peak_of(|| decode_payload::<MasterRequest>(&payload).is_ok());
        prop_assert!(peak <= budget, "request decode allocated {} bytes", peak);
        let (_, peak) = peak_of(|| decode_payload::<MasterResponse>(&payload).is_ok());
        prop_assert!(peak <= budget, "response decode allocated {} bytes", peak);
        let (_, peak) = peak_of(|| decode_bounded::<MasterRequest>(&payload, 64).is_ok());
        prop_assert!(peak <= budget, "bounded decode allocated {} bytes", peak);
        let _ = enum_result_error(&payload);
        let _ = error_frame::<MasterResponse>(&payload, ErrorCode::InternalError);
    }

    #[test]
    fn hostile_sequence_lengths_allocate_boundedly(
        variant in 0u8..40,
        declared in any::<u64>(),
        tail in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // A variant index, then a varint length (bincode: 0xfd = u64 follows) claiming
        // `declared` elements, then a few real bytes.
        let mut payload = vec![variant, 0xfd];
        payload.extend_from_slice(&declared.to_le_bytes());
        payload.extend_from_slice(&tail);
        let budget = decode_budget(payload.len());
        let (_, peak) = peak_of(|| decode_payload::<MasterRequest>(&payload).is_ok());
        prop_assert!(peak <= budget, "decode allocated {} bytes", peak);
        let (_, peak) = peak_of(|| decode_bounded::<MasterRequest>(&payload, 64).is_ok());
        prop_assert!(peak <= budget, "bounded decode allocated {} bytes", peak);
    }

    #[test]
    fn frame_readers_refuse_hostile_lengths_without_reserving_them(
        declared in any::<u32>(),
        sent in prop::collection::vec(any::<u8>(), 0..4096),
    ) {
        let mut wire = declared.to_le_bytes().to_vec();
        wire.extend_from_slice(&sent);
        let complete = declared as usize <= sent.len();
        let mut reader = WatchingReader { data: &wire, largest_ask: 0 };
        let (result, peak) = peak_of(|| read_frame(&mut reader));
        let limit = 2 * sent.len() + 128 * 1024;
        prop_assert!(peak <= limit, "read_frame allocated {} bytes for a {} byte frame", peak, sent.len());
        prop_assert!(reader.largest_ask <= limit, "read_frame asked for {} bytes", reader.largest_ask);
        if complete && declared as usize <= MAX_FRAME_LEN {
            prop_assert_eq!(result.unwrap(), &sent[..declared as usize]);
        } else {
            prop_assert_eq!(result.unwrap_err(), ErrorCode::RpcFail);
        }
        let rt = runtime();
        let (result, peak) = peak_of(|| rt.block_on(read_frame_async(&mut &wire[..])));
        prop_assert!(peak <= limit, "read_frame_async allocated {} bytes", peak);
        if complete && declared as usize <= MAX_FRAME_LEN {
            prop_assert_eq!(result.unwrap(), Some(sent[..declared as usize].to_vec()));
        } else {
            prop_assert!(result.is_err());
        }
    }

    #[test]
    fn plain_byte_counts_parse_exactly(n in any::<u64>()) {
        prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
        prop_assert_eq!(parse_size(&format!(" {n} B ")), Ok(n));
    }

    #[test]
    fn sizes_with_units_parse_exactly_or_overflow(
        n in any::<u64>(),
        unit in prop::sample::select(vec![
            ("k", 10u32), ("KB", 10), ("KiB", 10), ("m", 20), ("MB", 20), ("mib", 20),
            ("G", 30), ("gb", 30), ("GiB", 30), ("t", 40), ("TB", 40), ("TiB", 40),
        ]),
        space in any::<bool>(),
    ) {
        let (suffix, shift) = unit;
        let text = format!("{n}{}{suffix}", if space { " " } else { "" });
        match n.checked_mul(1u64 << shift) {
            Some(bytes) => prop_assert_eq!(parse_size(&text), Ok(bytes)),
            None => prop_assert_eq!(parse_size(&text), Err(ErrorCode::InvalidParams)),
        }
    }

    #[test]
    fn sizes_with_units_that_fit_parse_exactly(
        (shift, n) in prop::sample::select(vec![10u32, 20, 30, 40])
            .prop_flat_map(|shift| (Just(shift), 0..=u64::MAX >> shift)),
    ) {
        let suffix = match shift { 10 => "KiB", 20 => "MB", 30 => "g", _ => "T" };
        prop_assert_eq!(parse_size(&format!("{n} {suffix}")), Ok(n << shift));
    }

    #[test]
    fn size_strings_never_panic(text in "\\PC{0,40}") {
        let _ = parse_size(&text);
    }

    #[test]
    fn size_strings_from_digits_units_and_dots_never_panic(text in "[0-9.eE+ -]{0,30}[kKmMgGtTbBiI]{0,3}") {
        let _ = parse_size(&text);
    }

    #[test]
    fn tier_configs_round_trip(
        tiers in prop::collection::vec((1u64.., any::<i64>(), any::<bool>()), 0..8),
    ) {
        let json_tiers: Vec<String> = tiers
            .iter()
            .map(|(capacity, priority, lower)| {
                let kind = if *lower { "dram" } else { "DRAM" };
                format!(r#"{{"type":"{kind}","capacity":{capacity},"priority":{priority},"allocator_type":"OFFSET"}}"#)
            })
            .collect();
        let json = format!(r#"{{"tiers":[{}]}}"#, json_tiers.join(","));
        let parsed = TieredConfig::parse(&json).unwrap();
        let mut expected: Vec<(u64, i64)> = tiers.iter().map(|(c, p, _)| (*c, *p)).collect();
        expected.sort_by_key(|(_, p)| std::cmp::Reverse(*p));
        let got: Vec<(u64, i64)> = parsed.tiers.iter().map(|t| (t.capacity, t.priority)).collect();
        prop_assert_eq!(got, expected);
    }

    #[test]
    fn json_configs_never_panic(text in "\\PC{0,80}") {
        let _ = TieredConfig::parse(&text);
        let _ = TieredConfig::parse(&format!(r#"{{"tiers":[{text}]}}"#));
        let _ = TransferDirection::parse(&text);
    }

    #[test]
    fn directions_parse_in_any_case(upper in prop::collection::vec(any::<bool>(), 7), pad in " {0,3}") {
        let cased = |word: &str| -> String {
            word.chars()
                .zip(upper.iter().cycle())
                .map(|(c, up)| if *up { c.to_ascii_uppercase() } else { c })
                .collect()
        };
        prop_assert_eq!(
            TransferDirection::parse(&format!("{pad}{}{pad}", cased("forward"))),
            Ok(TransferDirection::Forward)
        );
        prop_assert_eq!(
            TransferDirection::parse(&cased("reverse")),
            Ok(TransferDirection::Reverse)
        );
    }

    #[test]
    fn percent_coding_round_trips(text in "\\PC{0,60}") {
        let encoded = percent_encode(&text);
        prop_assert_eq!(percent_decode(&encoded), Some(text.clone()));
        let request = HttpRequest {
            query: format!("a=1&key={encoded}&{text}"),
            ..HttpRequest::default()
        };
        prop_assert_eq!(request.query_param("key"), Some(text));
    }

    #[test]
    fn percent_decoding_never_panics(text in "[%0-9a-fA-F+&=\\PC]{0,40}") {
        let _ = percent_decode(&text);
        let _ = HttpRequest { query: text, ..HttpRequest::default() }.query_param("k");
    }
}

/// Found by `plain_byte_counts_parse_exactly`: a byte count above 2^53 came back rounded to
/// the nearest double (17232676107617919 parsed as 17232676107617920).
#[test]
fn byte_counts_above_two_to_the_53_parse_exactly() {
    assert_eq!(parse_size("17232676107617919"), Ok(17232676107617919));
    assert_eq!(parse_size("9007199254740993"), Ok(9007199254740993));
    assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
    assert_eq!(
        parse_size("18446744073709551616"),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(parse_size("16777215 TiB"), Ok(16777215 << 40));
    assert_eq!(parse_size("16777216 TiB"), Err(ErrorCode::InvalidParams));
    assert_eq!(parse_size("1.5 KB"), Ok(1536));
}

/// An HTTP server answering every request with its method, path, query and body.
fn echo_server() -> HttpServer {
    let handler: HttpHandler = Arc::new(|request: &HttpRequest| {
        let mut body =
            format!("{} {} {} ", request.method, request.path, request.query).into_bytes();
        body.extend_from_slice(&request.body);
        HttpResponse::text(200, body)
    });
    HttpServer::start("127.0.0.1:0".parse().unwrap(), handler).unwrap()
}

/// Sends `raw` on a fresh connection, half-closes, and returns what came back (bounded wait).
fn exchange(server: &HttpServer, raw: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(server.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = stream.write_all(raw);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    reply
}

fn http_request_bytes() -> impl Strategy<Value = Vec<u8>> {
    let method = prop::sample::select(vec!["GET", "PUT", "DELETE", "", "G ET"]);
    let target = "(/[a-z%?&=+0-9]{0,12}|[a-z]{0,4})";
    let version = prop::sample::select(vec!["HTTP/1.1", "HTTP/1.0", "HTTP/2", ""]);
    let header = "[A-Za-z-]{0,12}: ?[ -~]{0,20}";
    let length = prop::option::of(prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (0u64..64).prop_map(|n| n.to_string()),
        "[ -~]{0,8}",
    ]);
    let body = prop::collection::vec(any::<u8>(), 0..64);
    (
        method,
        target,
        version,
        prop::collection::vec(header, 0..4),
        length,
        body,
    )
        .prop_map(|(method, target, version, headers, length, body)| {
            let mut raw = format!("{method} {target} {version}\r\n");
            for header in headers {
                raw.push_str(&header);
                raw.push_str("\r\n");
            }
            if let Some(length) = length {
                raw.push_str(&format!("Content-Length: {length}\r\n"));
            }
            raw.push_str("\r\n");
            let mut raw = raw.into_bytes();
            raw.extend_from_slice(&body);
            raw
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Whatever a peer sends, the server answers with a well-formed status line or closes,
    /// and a well-formed request on a new connection is still served.
    #[test]
    fn the_http_server_survives_any_request(
        raw in prop_oneof![http_request_bytes(), prop::collection::vec(any::<u8>(), 0..256)],
    ) {
        let server = echo_server();
        let reply = exchange(&server, &raw);
        prop_assert!(reply.is_empty() || reply.starts_with(b"HTTP/1.1 "), "reply {:?}", String::from_utf8_lossy(&reply));
        let good = exchange(&server, b"GET /ok?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n");
        prop_assert!(good.starts_with(b"HTTP/1.1 200"), "after {:?}: {:?}", String::from_utf8_lossy(&raw), String::from_utf8_lossy(&good));
        server.shutdown();
    }
}
