//! The `lookahead-server` binary: see `lookahead-server --help`.

fn main() -> std::process::ExitCode {
    lookahead_server::main_with_args(std::env::args_os())
}
