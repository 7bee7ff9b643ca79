//! The shared library exports only `mc_*` and `mooncake_store_*` and has SONAME
//! `libmooncake_rs.so.0`. Uses binutils (`nm`, `readelf`) on the cdylib cargo built next to
//! this test binary.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/libmooncake_rs.so` (the test binary lives in `target/<profile>/deps`).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let lib = profile_dir.join("libmooncake_rs.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

fn tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .arg(cdylib())
        .output()
        .unwrap_or_else(|e| panic!("{cmd} not runnable: {e}"));
    assert!(out.status.success(), "{cmd} failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn only_mc_and_mooncake_store_symbols_are_exported() {
    let listing = tool("nm", &["-D", "--defined-only"]);
    let mut names = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, name) = match fields.as_slice() {
            [_, kind, name] => (*kind, *name),
            _ => continue,
        };
        assert!(
            name.starts_with("mc_") || name.starts_with("mooncake_store_"),
            "unexpected exported symbol {name} ({kind})"
        );
        assert_eq!(kind, "T", "{name} is not a function");
        names.push(name.to_string());
    }
    let mc = names.iter().filter(|n| n.starts_with("mc_")).count();
    let compat = names
        .iter()
        .filter(|n| n.starts_with("mooncake_store_"))
        .count();
    assert_eq!((mc, compat), (50, 19), "{names:?}");
}

#[test]
fn library_has_the_soname() {
    let dynamic = tool("readelf", &["-d"]);
    assert!(
        dynamic.contains("Library soname: [libmooncake_rs.so.0]"),
        "{dynamic}"
    );
}
