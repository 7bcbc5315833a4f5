//! What a refused client is told: the refusal's text without the server's own paths (the
//! whole text goes to the server's log). Issue 30: refusals showed absolute store and
//! write-cache paths.

use nbd_server::OpenError;

/// `e` as the client is told it: the server's own paths reduced to their file names (the
/// whole text is in the server's log).
pub(super) fn for_client(e: OpenError) -> OpenError {
    match e {
        OpenError::Busy(m) => OpenError::Busy(without_paths(&m)),
        OpenError::NotFound(m) => OpenError::NotFound(without_paths(&m)),
        OpenError::Other(m) => OpenError::Other(without_paths(&m)),
        OpenError::TlsRequired(m) => OpenError::TlsRequired(without_paths(&m)),
        OpenError::Forbidden(m) => OpenError::Forbidden(without_paths(&m)),
    }
}

/// `text` with every absolute path (a word starting with `/`, after any opening quote or
/// bracket) reduced to its last component: `open /srv/ferry/store/golden.vhdx: ...` becomes
/// `open golden.vhdx: ...`.
pub fn without_paths(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let lead = word.len() - word.trim_start_matches(['"', '\'', '(', '[', '`']).len();
        let (open, rest) = word.split_at(lead);
        out.push_str(open);
        match rest.strip_prefix('/') {
            Some(path) => {
                // Keep what closes the word (`"`, `:`, `)`, `,`) after the file name.
                let end = path
                    .find(['"', '\'', ')', ']', '`', ':', ','])
                    .unwrap_or(path.len());
                let (p, tail) = path.split_at(end);
                out.push_str(
                    p.trim_end_matches('/')
                        .rsplit('/')
                        .next()
                        .unwrap_or_default(),
                );
                out.push_str(tail);
            }
            None => out.push_str(rest),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_become_file_names() {
        let text = "open /srv/ferry/store/evil.vhdx: parent \"/srv/out/secret.vhdx\" \
                    outside the store (/srv/ferry/store), nothing else";
        assert_eq!(
            without_paths(text),
            "open evil.vhdx: parent \"secret.vhdx\" outside the store (store), nothing else"
        );
        assert_eq!(
            without_paths("no vdisk named \"x\""),
            "no vdisk named \"x\""
        );
    }
}
