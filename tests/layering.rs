//! The house rules of `src/` (`../shared/DESIGN.md` §1), checked on the source itself: which
//! part may name which (`crate::<part>` paths, grouped `crate::{..}` imports included; comments
//! and string literals are ignored), that no circle runs between parts, and that none runs
//! between the files of `client/`.
//!
//! A part is a folder or a file directly under `src/` (`src/bin/` and `src/lib.rs` are not
//! parts). Names under `crate::` that are not parts are the crate root's re-exports
//! (`crate::Result`, `crate::ErrorCode`, ...), all from the ground floor.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, top first. A part may name parts on its own floor or below, never above.
const FLOORS: &[&[&str]] = &[
    &["cli", "ffi"],
    &["client", "p2p", "transfer_api"],
    &["node"],
    &["stream", "standalone", "ha"],
    &["master", "metadata", "storage"],
    &["transfer"],
    &["rpc", "device", "shm"],
    &[
        "alloc",
        "auth",
        "env",
        "error",
        "process",
        "spin",
        "types",
        "test_util",
    ],
];

/// Imports forbidden even where the floors would allow them (the wire knows no caller, the
/// transfer engine knows no keys, the device layer knows no network).
const FORBIDDEN: &[(&str, &[&str])] = &[
    ("rpc", &["master", "transfer"]),
    ("node", &["client", "p2p"]),
    (
        "transfer",
        &["client", "master", "rpc", "standalone", "stream"],
    ),
    ("device", &["transfer", "stream"]),
    (
        "master",
        &[
            "client",
            "p2p",
            "node",
            "stream",
            "standalone",
            "ffi",
            "cli",
        ],
    ),
];

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `text` with comments and the contents of string and char literals blanked out.
fn code_only(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            i += end;
        } else if rest.starts_with("/*") {
            let end = rest.find("*/").map_or(rest.len(), |e| e + 2);
            i += end;
        } else if rest.starts_with("r#\"") || rest.starts_with("r\"") {
            let hashes = rest[1..].chars().take_while(|&c| c == '#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            let end = rest[body..]
                .find(&close)
                .map_or(rest.len(), |e| body + e + close.len());
            out.push_str("\"\"");
            i += end;
        } else if bytes[i] == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i = j + 1;
        } else if bytes[i] == b'\''
            && rest.len() > 2
            && (rest.as_bytes()[2] == b'\'' || rest.as_bytes()[1] == b'\\')
        {
            // A char literal ('x' or '\n'); lifetimes ('a) are left alone.
            let end = rest[1..].find('\'').map_or(rest.len(), |e| e + 2);
            out.push_str("' '");
            i += end;
        } else {
            let c = rest.chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segments named after `prefix` (`crate::`, `super::`): `crate::a::b` gives
/// `a`; `crate::{a::x, b}` gives `a` and `b`.
fn first_segments(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find(prefix) {
        let start = from + at;
        from = start + prefix.len();
        if code[..start].chars().next_back().is_some_and(is_ident) {
            continue; // `$crate::` stays, `mycrate::` does not count
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            let mut at_item_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        if !item.is_empty() {
                            out.push(std::mem::take(&mut item));
                        }
                        at_item_start = true;
                        continue;
                    }
                    _ => {}
                }
                if depth == 1 && at_item_start {
                    if is_ident(c) {
                        item.push(c);
                    } else if !item.is_empty() {
                        out.push(std::mem::take(&mut item));
                        at_item_start = false;
                    }
                }
            }
            if !item.is_empty() {
                out.push(item);
            }
        } else {
            let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The part (folder or top-level file) a file under `src/` belongs to; `None` for `src/bin/`
/// and `src/lib.rs`.
fn part_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "bin" | "lib.rs" => None,
        _ => Some(first.trim_end_matches(".rs").to_string()),
    }
}

/// part → (named part → the files that name it).
fn part_imports() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let src = src_dir();
    let files = rust_files(&src);
    let parts: BTreeSet<String> = files.iter().filter_map(|f| part_of(&src, f)).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for file in &files {
        let Some(part) = part_of(&src, file) else {
            continue;
        };
        let code = code_only(&fs::read_to_string(file).unwrap());
        let entry = graph.entry(part.clone()).or_default();
        for name in first_segments(&code, "crate::") {
            if name != part && parts.contains(&name) {
                let rel = file.strip_prefix(&src).unwrap().display().to_string();
                entry.entry(name).or_default().insert(rel);
            }
        }
    }
    graph
}

fn floor_of(part: &str) -> usize {
    FLOORS
        .iter()
        .position(|floor| floor.contains(&part))
        .unwrap_or_else(|| panic!("part `{part}` is on no floor: add it to FLOORS (and DESIGN.md)"))
}

/// A circle in `graph`, as the list of nodes around it, if there is one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn every_part_names_only_parts_on_its_floor_or_below() {
    let mut violations = Vec::new();
    for (part, named) in part_imports() {
        for (other, files) in named {
            if floor_of(&other) < floor_of(&part) {
                violations.push(format!("{part} names {other} (a floor above) in {files:?}"));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn the_named_seams_hold() {
    let graph = part_imports();
    let mut violations = Vec::new();
    for (part, forbidden) in FORBIDDEN {
        for other in *forbidden {
            if let Some(files) = graph.get(*part).and_then(|named| named.get(*other)) {
                violations.push(format!("{part} must not name {other}: {files:?}"));
            }
        }
    }
    for (part, named) in &graph {
        if let (false, Some(files)) = (part == "ffi", named.get("ffi")) {
            violations.push(format!("only ffi may name ffi; {part} does in {files:?}"));
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn no_circle_runs_between_parts() {
    let graph: BTreeMap<String, BTreeSet<String>> = part_imports()
        .into_iter()
        .map(|(part, named)| (part, named.into_keys().collect()))
        .collect();
    assert_eq!(find_circle(&graph), None);
}

#[test]
fn no_circle_runs_between_the_files_of_client() {
    let dir = src_dir().join("client");
    let files = rust_files(&dir);
    let names: BTreeSet<String> = files
        .iter()
        .map(|f| f.file_stem().unwrap().to_str().unwrap().to_string())
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let me = file.file_stem().unwrap().to_str().unwrap().to_string();
        if me == "mod" {
            continue; // declares the files; names none of their internals
        }
        let code = code_only(&fs::read_to_string(file).unwrap());
        let mut named: BTreeSet<String> = first_segments(&code, "super::").into_iter().collect();
        let inside = code.replace("crate::client::", "super::");
        named.extend(first_segments(&inside, "super::"));
        named.retain(|n| n != &me && n != "mod" && names.contains(n));
        graph.insert(me, named);
    }
    assert!(graph.contains_key("core"), "client/core.rs not found");
    assert_eq!(find_circle(&graph), None);
}

#[test]
fn the_parser_sees_grouped_paths_and_ignores_comments_and_strings() {
    let code = code_only(
        "use crate::{a::X, b, c::{d, e}};\n// crate::hidden\nlet s = \"crate::quoted\";\n\
         fn f<'a>(x: &'a str) -> char { 'y' } use crate::z::W; use $crate::m;",
    );
    assert_eq!(first_segments(&code, "crate::"), ["a", "b", "c", "z", "m"]);
}
