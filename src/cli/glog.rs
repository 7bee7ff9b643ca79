//! glog's logging flags, accepted verbatim because upstream's scripts and CI pass them, and
//! mapped onto our `tracing` set-up. Logs always go to stderr, so `--logtostderr`,
//! `--alsologtostderr`, `--stderrthreshold` and `--colorlogtostderr` only decide whether
//! `--log_dir` also writes a file (glog writes none with `--logtostderr`); `--v` and
//! `--minloglevel` set the level unless `MC_LOG` is set.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// glog's flags, flattened into each program's flags. Booleans take gflags' forms: `--flag`,
/// `--flag=VALUE` (true/false, 1/0, yes/no, t/f, y/n) and `--noflag`; the last one given wins.
#[derive(clap::Args, Debug)]
pub(super) struct GlogFlags {
    /// Log to stderr only, no log file (glog flag; our logs always go to stderr).
    #[arg(long = "logtostderr", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = gflags_bool, overrides_with = "nologtostderr")]
    logtostderr: bool,
    #[arg(long = "nologtostderr", hide = true, overrides_with = "logtostderr")]
    nologtostderr: bool,
    /// Log to stderr as well as to the --log_dir file (glog flag; always so here).
    #[arg(long = "alsologtostderr", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = gflags_bool, overrides_with = "noalsologtostderr")]
    alsologtostderr: bool,
    #[arg(
        long = "noalsologtostderr",
        hide = true,
        overrides_with = "alsologtostderr"
    )]
    noalsologtostderr: bool,
    /// Colour stderr lines (glog flag; accepted, colours are as without it).
    #[arg(long = "colorlogtostderr", num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", value_parser = gflags_bool, overrides_with = "nocolorlogtostderr")]
    colorlogtostderr: bool,
    #[arg(
        long = "nocolorlogtostderr",
        hide = true,
        overrides_with = "colorlogtostderr"
    )]
    nocolorlogtostderr: bool,
    /// Lowest severity copied to stderr (glog flag; accepted, every line goes to stderr).
    #[arg(long = "stderrthreshold", default_value_t = 2)]
    stderrthreshold: i32,
    /// Verbose logging: 1 shows debug lines, 2 and more trace lines (glog flag).
    #[arg(long = "v", default_value_t = 0)]
    v: i32,
    /// Lowest severity logged: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL, i.e. nothing (glog flag;
    /// without it and without --v: warnings and errors).
    #[arg(long = "minloglevel")]
    minloglevel: Option<i32>,
    /// Also write the log to `<log_dir>/<program>.log`, unless --logtostderr (glog flag).
    #[arg(long = "log_dir", default_value = "")]
    log_dir: OsString,
}

impl GlogFlags {
    /// Installs the process's logging for `program` (see [`crate::init_logging_with`]). A log
    /// file that cannot be opened is reported once on stderr and logging goes on to stderr
    /// only, as glog does.
    pub(super) fn init_logging(&self, program: &str) {
        let directive = self.directive();
        let file = self.log_file(program);
        if let Some(path) = &file {
            match crate::init_logging_with(directive, Some(path)) {
                Ok(()) => return,
                Err(e) => eprintln!(
                    "{program}: cannot write the log to {}: {e}; logging to stderr only",
                    path.display()
                ),
            }
        }
        // Without a file nothing can fail.
        let _ = crate::init_logging_with(directive, None);
        for flag in self.flags_without_effect() {
            tracing::debug!("--{flag} has no effect: every log line goes to stderr");
        }
    }

    /// The `tracing` level from --minloglevel and --v. As in glog, verbose lines are INFO lines:
    /// --minloglevel of 1 or more hides them.
    fn directive(&self) -> &'static str {
        match (self.minloglevel, self.v) {
            (Some(3..), _) => "off",
            (Some(2), _) => "error",
            (Some(1), _) => "warn",
            (_, 2..) => "trace",
            (_, 1) => "debug",
            (Some(_), _) => "info",
            (None, _) => "warn",
        }
    }

    /// `<log_dir>/<program>.log`, or `None` without --log_dir or with --logtostderr.
    fn log_file(&self, program: &str) -> Option<PathBuf> {
        let to_stderr_only = self.logtostderr && !self.nologtostderr;
        if self.log_dir.is_empty() || to_stderr_only {
            return None;
        }
        Some(Path::new(&self.log_dir).join(format!("{program}.log")))
    }

    /// The glog flags given that change nothing here.
    fn flags_without_effect(&self) -> Vec<&'static str> {
        [
            (self.alsologtostderr, "alsologtostderr"),
            (self.noalsologtostderr, "noalsologtostderr"),
            (self.colorlogtostderr, "colorlogtostderr"),
            (self.nocolorlogtostderr, "nocolorlogtostderr"),
            (self.stderrthreshold != 2, "stderrthreshold"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
        .collect()
    }
}

/// gflags' boolean values, case-insensitive: true/t/yes/y/1 and false/f/no/n/0.
pub(super) fn gflags_bool(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "t" | "yes" | "y" | "1" => Ok(true),
        "false" | "f" | "no" | "n" | "0" => Ok(false),
        _ => Err(format!(
            "'{text}' is not a boolean (true/false, 1/0, yes/no)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Only {
        #[command(flatten)]
        glog: GlogFlags,
    }

    fn parse(args: &[&str]) -> Result<GlogFlags, clap::Error> {
        let argv = std::iter::once("prog").chain(args.iter().copied());
        Only::try_parse_from(argv).map(|only| only.glog)
    }

    fn directive(args: &[&str]) -> &'static str {
        parse(args).expect("flags parse").directive()
    }

    #[test]
    fn gflags_booleans_take_every_spelling_and_refuse_others() {
        for (text, value) in [("TRUE", true), ("t", true), ("yes", true), ("1", true)] {
            assert_eq!(gflags_bool(text), Ok(value), "{text}");
        }
        for text in ["false", "F", "no", "n", "0"] {
            assert_eq!(gflags_bool(text), Ok(false), "{text}");
        }
        assert!(gflags_bool("maybe").is_err());
        let refused = parse(&["--logtostderr=maybe"]).err().map(|e| e.exit_code());
        assert_eq!(refused, Some(2));
    }

    #[test]
    fn v_and_minloglevel_pick_the_level_and_minloglevel_hides_verbose_lines() {
        assert_eq!(directive(&[]), "warn");
        assert_eq!(directive(&["--v=1"]), "debug");
        assert_eq!(directive(&["--v=3"]), "trace");
        assert_eq!(directive(&["--v=-1"]), "warn");
        assert_eq!(directive(&["--minloglevel=0"]), "info");
        assert_eq!(directive(&["--minloglevel=0", "--v=1"]), "debug");
        assert_eq!(directive(&["--minloglevel=1", "--v=2"]), "warn");
        assert_eq!(directive(&["--minloglevel=2"]), "error");
        assert_eq!(directive(&["--minloglevel=3"]), "off");
    }

    #[test]
    fn log_dir_names_a_file_per_program_unless_logtostderr_wins_last() {
        let file = |args: &[&str]| {
            parse(args)
                .expect("flags parse")
                .log_file("mooncake_master")
        };
        let expected = Some(PathBuf::from("/logs/mooncake_master.log"));
        assert_eq!(file(&[]), None);
        assert_eq!(file(&["--log_dir="]), None);
        assert_eq!(file(&["--log_dir=/logs"]), expected);
        assert_eq!(file(&["--log_dir=/logs", "--logtostderr"]), None);
        assert_eq!(file(&["--log_dir=/logs", "--logtostderr=0"]), expected);
        assert_eq!(
            file(&["--log_dir=/logs", "--logtostderr", "--nologtostderr"]),
            expected
        );
        assert_eq!(
            file(&["--log_dir=/logs", "--nologtostderr", "--logtostderr"]),
            None
        );
    }

    #[test]
    fn flags_that_change_nothing_are_named() {
        let flags = parse(&["--alsologtostderr", "--stderrthreshold=0", "--logtostderr"]);
        let named = flags.expect("flags parse").flags_without_effect();
        assert_eq!(named, ["alsologtostderr", "stderrthreshold"]);
    }
}
