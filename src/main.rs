fn main() -> std::process::ExitCode {
    qlsched::cli::main()
}
