//! `mooncake_master`: see [`mooncake_rs::cli::run_master`].

fn main() {
    std::process::exit(mooncake_rs::cli::run_master(std::env::args_os()))
}
