//! `mooncake_client`: see [`mooncake_rs::cli::run_client`].

fn main() {
    std::process::exit(mooncake_rs::cli::run_client(std::env::args_os()))
}
