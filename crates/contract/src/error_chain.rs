//! Printing an error with its causes, the one way every crate reports errors
//! (`error: what: cause: cause`; STYLE.md §4: messages never repeat their source).

use std::error::Error;
use std::fmt;

/// Displays an error and each of its sources, separated by `": "`.
///
/// ```
/// let e = std::io::Error::other("disk full");
/// assert_eq!(contract::ErrorChain(&e).to_string(), "disk full");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("open store")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_follow_the_error_after_colons() {
        let e = Outer(std::io::Error::other("permission denied"));
        assert_eq!(ErrorChain(&e).to_string(), "open store: permission denied");
    }
}
