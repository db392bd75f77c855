//! `uraid man` and `uraid completions`: the manual pages and the shell
//! completions, generated from the command line's own definitions (by
//! clap_mangen and clap_complete), so that they never drift from what the
//! command accepts.

use super::{Cli, CliResult};
use clap::CommandFactory;
use std::path::Path;

/// The shells `uraid completions` writes a script for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Section 8, system administration commands, as mdadm(8).
const SECTION: &str = "8";

/// The command as its pages and completions describe it: `help` is an
/// option on every command, not a subcommand of its own to document.
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    // Building names the subcommands `uraid-create`, ... for their pages.
    cmd.build();
    cmd
}

/// Writes uraid.8 and one page per subcommand (uraid-create.8, and for
/// nested ones uraid-bench-parity.8) into `dir`, made if missing.
pub fn write_pages(dir: &Path) -> CliResult {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut written = 0;
    write_page(command(), dir, &mut written)?;
    assert!(written > 1, "uraid has subcommands, so more than one page");
    eprintln!("uraid: {written} manual pages in {}", dir.display());
    Ok(())
}

fn write_page(cmd: clap::Command, dir: &Path, written: &mut usize) -> CliResult {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_page(sub.clone(), dir, written)?;
    }
    // Every page says which uraid it describes, a subcommand's too.
    let page = clap_mangen::Man::new(cmd)
        .section(SECTION)
        .source(format!("uraid {}", env!("CARGO_PKG_VERSION")))
        .manual("System Administration");
    let path = page
        .generate_to(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    assert!(path.starts_with(dir));
    *written += 1;
    Ok(())
}

/// Prints the completion script for `shell` on stdout.
pub fn print_completions(shell: Shell) -> CliResult {
    let generator = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut cmd = command();
    clap_complete::generate(generator, &mut cmd, "uraid", &mut std::io::stdout());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::command;

    #[test]
    fn every_subcommand_gets_a_page_named_after_it() {
        let cmd = command();
        let names: Vec<String> = cmd
            .get_subcommands()
            .map(|s| s.get_display_name().unwrap_or(s.get_name()).to_string())
            .collect();
        assert!(names.contains(&"uraid-stop".to_string()), "{names:?}");
        assert!(names.contains(&"uraid-zero-superblock".to_string()));
        assert!(!names.iter().any(|n| n == "uraid-help"), "{names:?}");
    }
}
