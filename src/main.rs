fn main() -> std::process::ExitCode {
    // A shell command's supervisor (the worker runs this binary as one) never reaches the CLI.
    qlsched::worker::supervise::main_if_asked();
    qlsched::cli::main()
}
