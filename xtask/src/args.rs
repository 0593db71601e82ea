//! A tiny command-line parser shared by the subcommands: flags (`-n 4`, `-n4`, `--ranks 4`,
//! `--ranks=4`), positionals, and `--`, after which everything is positional.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;

/// A mistake in the command line; printed with a pointer to the usage, exit code 2.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct UsageError(pub(crate) String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One token of the command line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arg {
    /// A flag as written, without any `=value` or attached short value: `-n`, `--ranks`.
    Flag(String),
    /// A token that is not a flag (or any token after `--`).
    Positional(OsString),
    /// `--`: what follows is positional.
    Separator,
}

/// The command-line tokens not consumed yet.
#[derive(Debug)]
pub(crate) struct Args {
    rest: VecDeque<OsString>,
    /// A value attached to the last flag (`--x=v`, `-nV`) that no one has taken yet.
    attached: Option<(String, OsString)>,
    after_separator: bool,
}

impl Args {
    /// Parses `items` (without the program name).
    pub(crate) fn new<I: IntoIterator<Item = S>, S: Into<OsString>>(items: I) -> Self {
        Args { rest: items.into_iter().map(Into::into).collect(), attached: None, after_separator: false }
    }

    /// This process's arguments, without the program name.
    pub(crate) fn from_env() -> Self {
        Args::new(std::env::args_os().skip(1))
    }

    /// The next token; `None` at the end. Errors when the previous flag had a value attached
    /// that it did not take (`--help=x`), or a flag is not UTF-8.
    pub(crate) fn next(&mut self) -> Result<Option<Arg>, UsageError> {
        if let Some((flag, _)) = self.attached.take() {
            return Err(UsageError(format!("{flag} takes no value")));
        }
        let Some(token) = self.rest.pop_front() else { return Ok(None) };
        if self.after_separator {
            return Ok(Some(Arg::Positional(token)));
        }
        if token == "--" {
            self.after_separator = true;
            return Ok(Some(Arg::Separator));
        }
        let Some(text) = token.to_str() else {
            return Ok(Some(Arg::Positional(token)));
        };
        if let Some(long) = text.strip_prefix("--") {
            return Ok(Some(match long.split_once('=') {
                Some((name, value)) => {
                    let flag = format!("--{name}");
                    self.attached = Some((flag.clone(), value.into()));
                    Arg::Flag(flag)
                }
                None => Arg::Flag(text.to_string()),
            }));
        }
        if text.len() > 1 && text.starts_with('-') {
            let mut chars = text[1..].chars();
            let Some(c) = chars.next() else { return Ok(Some(Arg::Positional(token))) };
            let flag = format!("-{c}");
            let tail = chars.as_str();
            if !tail.is_empty() {
                self.attached = Some((flag.clone(), tail.into()));
            }
            return Ok(Some(Arg::Flag(flag)));
        }
        Ok(Some(Arg::Positional(token)))
    }

    /// The value of `flag`, the flag just returned by [`Args::next`]: its attached value, or
    /// the next token.
    pub(crate) fn value(&mut self, flag: &str) -> Result<OsString, UsageError> {
        if let Some((_, v)) = self.attached.take() {
            return Ok(v);
        }
        self.rest.pop_front().ok_or_else(|| UsageError(format!("{flag} needs a value")))
    }

    /// The value of `flag` parsed as `T`; `what` describes the expected value in the error.
    pub(crate) fn parse<T: FromStr>(&mut self, flag: &str, what: &str) -> Result<T, UsageError> {
        let v = self.value(flag)?;
        v.to_str().and_then(|s| s.parse().ok()).ok_or_else(|| UsageError(format!("{flag} expects {what}, got {v:?}")))
    }

    /// Every token left, verbatim.
    pub(crate) fn rest(&mut self) -> Vec<OsString> {
        self.rest.drain(..).collect()
    }

    /// Removes and returns the first token (the subcommand name), if any.
    pub(crate) fn subcommand(&mut self) -> Option<OsString> {
        self.rest.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flag(s: &str) -> Option<Arg> {
        Some(Arg::Flag(s.into()))
    }

    #[test]
    fn flags_values_and_separator() {
        let mut a = Args::new(["-n", "4", "-n8", "--timeout=2.5", "--master-addr", "::1", "x", "--", "-n", "--y"]);
        assert_eq!(a.next().unwrap(), flag("-n"));
        assert_eq!(a.parse::<usize>("-n", "a count").unwrap(), 4);
        assert_eq!(a.next().unwrap(), flag("-n"));
        assert_eq!(a.parse::<usize>("-n", "a count").unwrap(), 8);
        assert_eq!(a.next().unwrap(), flag("--timeout"));
        assert_eq!(a.parse::<f64>("--timeout", "seconds").unwrap(), 2.5);
        assert_eq!(a.next().unwrap(), flag("--master-addr"));
        assert_eq!(a.value("--master-addr").unwrap(), "::1");
        assert_eq!(a.next().unwrap(), Some(Arg::Positional("x".into())));
        assert_eq!(a.next().unwrap(), Some(Arg::Separator));
        assert_eq!(a.next().unwrap(), Some(Arg::Positional("-n".into())));
        assert_eq!(a.rest(), ["--y"]);
        assert_eq!(a.next().unwrap(), None);
    }

    #[test]
    fn mistakes_are_usage_errors() {
        let mut a = Args::new(["--help=x"]);
        assert_eq!(a.next().unwrap(), flag("--help"));
        assert_eq!(a.next(), Err(UsageError("--help takes no value".into())));
        let mut a = Args::new(["-n"]);
        a.next().unwrap();
        assert_eq!(a.value("-n"), Err(UsageError("-n needs a value".into())));
        let mut a = Args::new(["-n", "four"]);
        a.next().unwrap();
        assert!(a.parse::<usize>("-n", "a count").unwrap_err().0.contains("expects a count"));
        let mut a = Args::new(["-", "sub"]);
        assert_eq!(a.next().unwrap(), Some(Arg::Positional("-".into())));
        assert_eq!(a.subcommand().unwrap(), "sub");
    }
}
