//! The committed header `include/mooncake_rs.h` is exactly what the pinned cbindgen makes
//! from the sources and `cbindgen.toml`; its version macros agree with Cargo.toml; every
//! exported `mc_*` function is declared and documented, and runs inside the panic boundary.
//!
//! Regenerate the header: `MC_UPDATE_HEADER=1 cargo test --test ffi_header`.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate() -> String {
    let config = cbindgen::Config::from_file(root().join("cbindgen.toml")).expect("cbindgen.toml");
    // Only the C surface is parsed (src/ffi/mod.rs and the modules it declares), so public
    // items of other modules never leak into the header.
    let builder = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root().join("src").join("ffi").join("mod.rs"));
    let bindings = builder.generate().expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("UTF-8 header")
}

fn header_path() -> PathBuf {
    root().join("include").join("mooncake_rs.h")
}

#[test]
fn committed_header_is_fresh() {
    let fresh = generate();
    let path = header_path();
    if std::env::var_os("MC_UPDATE_HEADER").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &fresh).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != fresh {
        let tmp = std::env::temp_dir().join("mooncake_rs.fresh.h");
        std::fs::write(&tmp, &fresh).unwrap();
        panic!(
            "include/mooncake_rs.h is stale; compare with {} or run \
             `MC_UPDATE_HEADER=1 cargo test --test ffi_header`",
            tmp.display()
        );
    }
}

fn define(header: &str, name: &str) -> u32 {
    let line = header
        .lines()
        .find(|l| l.starts_with(&format!("#define {name} ")))
        .unwrap_or_else(|| panic!("{name} missing from the header"));
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn version_macros_agree_with_cargo_and_mc_version() {
    let header = std::fs::read_to_string(header_path()).unwrap();
    let major: u32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: u32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let patch: u32 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap();
    assert_eq!(define(&header, "MC_VERSION_MAJOR"), major);
    assert_eq!(define(&header, "MC_VERSION_MINOR"), minor);
    assert_eq!(define(&header, "MC_VERSION_PATCH"), patch);
    use mooncake_rs::ffi::error::*;
    assert_eq!(
        (MC_VERSION_MAJOR, MC_VERSION_MINOR, MC_VERSION_PATCH),
        (major, minor, patch)
    );
    // SAFETY: mc_version returns a static NUL-terminated string.
    let runtime = unsafe { std::ffi::CStr::from_ptr(mc_version()) };
    assert_eq!(runtime.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
}

/// Every `extern "C" fn` in src/ffi: (file, name, body).
fn exported_functions() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let dir = root().join("src").join("ffi");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for (i, _) in text.match_indices("extern \"C\" fn ") {
            let rest = &text[i + "extern \"C\" fn ".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let body_start = rest.find(" {\n").expect("function body");
            let body = &rest[body_start..];
            let body_end = body.find("\n}\n").expect("end of body");
            out.push((file.clone(), name, body[..body_end].to_string()));
        }
    }
    out
}

#[test]
fn every_exported_function_is_literal_no_mangle_and_inside_the_boundary() {
    let dir = root().join("src").join("ffi");
    let functions = exported_functions();
    assert!(functions.len() >= 69, "found {}", functions.len());
    for (file, name, body) in &functions {
        let trimmed = body.trim_start_matches(" {").trim();
        assert!(
            trimmed.starts_with("ffi_boundary!("),
            "{file}: {name} does not run inside ffi_boundary!"
        );
        let text = std::fs::read_to_string(Path::new(&dir).join(file)).unwrap();
        assert!(
            text.contains(&format!("#[no_mangle]\npub extern \"C\" fn {name}("))
                || text.contains(&format!(
                    "#[no_mangle]\n#[must_use]\npub extern \"C\" fn {name}("
                )),
            "{file}: {name} is not a literal #[no_mangle] pub extern \"C\" fn"
        );
    }
}

#[test]
fn every_mc_function_is_declared_and_documented_in_the_header() {
    let header = std::fs::read_to_string(header_path()).unwrap();
    let lines: Vec<&str> = header.lines().collect();
    for (_, name, _) in exported_functions() {
        if !name.starts_with("mc_") {
            assert!(
                name.starts_with("mooncake_store_"),
                "unexpected export {name}"
            );
            assert!(
                !header.contains(&format!("{name}(")),
                "{name} leaked into mooncake_rs.h"
            );
            continue;
        }
        let at = lines
            .iter()
            .position(|l| {
                !l.starts_with(" *")
                    && !l.starts_with("/*")
                    && (l.contains(&format!(" {name}(")) || l.contains(&format!("*{name}(")))
            })
            .unwrap_or_else(|| panic!("{name} not declared in mooncake_rs.h"));
        // The declaration (possibly preceded by MC_MUST_USE) follows a doc comment.
        let mut k = at;
        while k > 0 && lines[k - 1].trim() == "MC_MUST_USE" {
            k -= 1;
        }
        assert!(
            k > 0 && lines[k - 1].trim_end().ends_with("*/"),
            "{name} has no doc comment"
        );
    }
}

/// Prototypes (`ret name(args);`, whitespace collapsed, comments dropped) in a header.
fn prototypes(header: &str, prefix: &str) -> std::collections::BTreeMap<String, String> {
    let mut text = String::new();
    let mut rest = header;
    // Drop comments.
    while let Some(start) = rest.find("/*") {
        text.push_str(&rest[..start]);
        rest = rest[start..]
            .split_once("*/")
            .map_or("", |(_, after)| after);
    }
    text.push_str(rest);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = std::collections::BTreeMap::new();
    for stmt in flat.split(';') {
        let stmt = stmt.trim();
        let Some(open) = stmt.find('(') else { continue };
        let before = &stmt[..open];
        let name = before.rsplit([' ', '*']).next().unwrap_or("");
        if name.starts_with(prefix) && stmt.ends_with(')') {
            let stmt = stmt.rsplit_once('}').map_or(stmt, |(_, s)| s).trim();
            out.insert(name.to_string(), stmt.replace("( ", "(").replace(" )", ")"));
        }
    }
    out
}

#[test]
fn store_c_h_declares_exactly_the_rust_mooncake_store_functions() {
    let mut config = cbindgen::Config {
        language: cbindgen::Language::C,
        documentation: false,
        usize_is_size_t: true,
        ..Default::default()
    };
    config.function.args = cbindgen::Layout::Horizontal;
    let generated = cbindgen::Builder::new()
        .with_config(config)
        .with_src(root().join("src").join("ffi").join("store_c.rs"))
        .generate()
        .expect("cbindgen parses store_c.rs");
    let mut out = Vec::new();
    generated.write(&mut out);
    let generated = prototypes(&String::from_utf8(out).unwrap(), "mooncake_store_");
    let handwritten = prototypes(
        &std::fs::read_to_string(root().join("include").join("store_c.h")).unwrap(),
        "mooncake_store_",
    );
    assert_eq!(generated.len(), 19, "{generated:#?}");
    assert_eq!(handwritten, generated);
}
