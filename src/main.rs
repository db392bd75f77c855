fn main() {
    std::process::exit(uraid::cli::main());
}
