//! Metadata context queries ("Metadata querying", `NBD_OPT_LIST_META_CONTEXT`,
//! `NBD_OPT_SET_META_CONTEXT`) and the one context this server knows, `base:allocation`.
//!
//! ```text
//! u32 export name length | name | u32 query count | count × (u32 length | query)
//! ```

use crate::wire::{Reader, parse_string, put_str32};

/// The `base:allocation` context name.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The namespace this server implements.
pub const BASE_NAMESPACE: &str = "base";
/// The most queries one option may carry (more are `NBD_REP_ERR_INVALID`... the option
/// length cap already bounds them; this bounds the work per option).
pub const MAX_META_QUERIES: usize = 256;

/// Errors of this module.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The export name or a query is not a valid protocol string.
    #[error("invalid string in meta context option")]
    InvalidString,
    /// The option lists more than [`MAX_META_QUERIES`] queries.
    #[error("{count} meta context queries, over the limit of {MAX_META_QUERIES}")]
    TooManyQueries {
        /// Declared count.
        count: u32,
    },
    /// Bytes remain after the last query.
    #[error("{len} trailing bytes after the meta context queries")]
    TrailingData {
        /// Extra bytes.
        len: usize,
    },
    /// A length field points past the option's data.
    #[error("meta context option truncated: need {need} more bytes")]
    Truncated {
        /// Missing bytes.
        need: usize,
    },
}

impl From<crate::wire::Short> for MetaError {
    fn from(s: crate::wire::Short) -> Self {
        MetaError::Truncated { need: s.need }
    }
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaQuery {
    /// The export the contexts are for.
    pub export: String,
    /// The queries, e.g. "base:allocation" or "base:".
    pub queries: Vec<String>,
}

/// A metadata context this server can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaContext {
    /// `base:allocation`: `NBD_STATE_HOLE` / `NBD_STATE_ZERO` per extent.
    BaseAllocation,
}

impl MetaContext {
    /// The context's name.
    pub fn name(&self) -> &'static str {
        match self {
            MetaContext::BaseAllocation => BASE_ALLOCATION,
        }
    }
}

/// Splits "ns:leaf" into its namespace and leaf; `None` without a colon or namespace.
pub fn split_query(query: &str) -> Option<(&str, &str)> {
    let (ns, leaf) = query.split_once(':')?;
    (!ns.is_empty()).then_some((ns, leaf))
}

/// The contexts one query lists (`NBD_OPT_LIST_META_CONTEXT`): `base:` is a wildcard over
/// the `base` namespace; unknown namespaces and leaves match nothing.
pub fn list_matches(query: &str) -> Option<MetaContext> {
    match split_query(query)? {
        (BASE_NAMESPACE, "") | (BASE_NAMESPACE, "allocation") => Some(MetaContext::BaseAllocation),
        _ => None,
    }
}

/// The context one query selects (`NBD_OPT_SET_META_CONTEXT`): only an exact name; the
/// `base:` wildcard "MUST be ignored" there.
pub fn set_matches(query: &str) -> Option<MetaContext> {
    match split_query(query)? {
        (BASE_NAMESPACE, "allocation") => Some(MetaContext::BaseAllocation),
        _ => None,
    }
}

impl MetaQuery {
    /// Parses the option data.
    ///
    /// # Errors
    /// `Truncated`, `InvalidString`, `TooManyQueries`, `TrailingData`.
    pub fn parse(payload: &[u8]) -> Result<MetaQuery, MetaError> {
        let mut r = Reader::new(payload);
        let n = r.u32()? as usize;
        let export = parse_string(r.bytes(n)?).ok_or(MetaError::InvalidString)?;
        let count = r.u32()?;
        if count as usize > MAX_META_QUERIES {
            return Err(MetaError::TooManyQueries { count });
        }
        let mut queries = Vec::new();
        for _ in 0..count {
            let n = r.u32()? as usize;
            queries.push(parse_string(r.bytes(n)?).ok_or(MetaError::InvalidString)?);
        }
        if r.remaining() != 0 {
            return Err(MetaError::TrailingData { len: r.remaining() });
        }
        Ok(MetaQuery { export, queries })
    }

    /// Appends the option data.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_str32(out, &self.export);
        let n = u32::try_from(self.queries.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&n.to_be_bytes());
        for q in &self.queries {
            put_str32(out, q);
        }
    }

    /// The contexts `NBD_OPT_LIST_META_CONTEXT` answers with: all of them for no query,
    /// else those matching some query, each once.
    pub fn listed(&self) -> Vec<MetaContext> {
        if self.queries.is_empty() {
            return vec![MetaContext::BaseAllocation];
        }
        dedup(self.queries.iter().filter_map(|q| list_matches(q)))
    }

    /// The contexts `NBD_OPT_SET_META_CONTEXT` selects, each once.
    pub fn selected(&self) -> Vec<MetaContext> {
        dedup(self.queries.iter().filter_map(|q| set_matches(q)))
    }
}

fn dedup(it: impl Iterator<Item = MetaContext>) -> Vec<MetaContext> {
    let mut out = Vec::new();
    for c in it {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(queries: &[&str]) -> MetaQuery {
        MetaQuery {
            export: "golden".into(),
            queries: queries.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn set_ignores_base_wildcard() {
        assert!(q(&["base:"]).selected().is_empty());
    }

    #[test]
    fn list_base_wildcard_matches_allocation() {
        assert_eq!(q(&["base:"]).listed(), vec![MetaContext::BaseAllocation]);
    }

    #[test]
    fn list_without_queries_lists_everything() {
        assert_eq!(q(&[]).listed(), vec![MetaContext::BaseAllocation]);
    }

    #[test]
    fn unknown_namespace_selects_nothing() {
        assert!(q(&["qemu:dirty-bitmap:x", "nocolon"]).selected().is_empty());
    }

    #[test]
    fn duplicate_queries_select_once() {
        let sel = q(&["base:allocation", "base:allocation"]).selected();
        assert_eq!(sel, vec![MetaContext::BaseAllocation]);
    }

    #[test]
    fn query_length_past_data_is_truncated() {
        // export "" then 1 query of declared length 10 with 2 bytes present.
        let data = [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 10, b'b', b'a'];
        assert_eq!(
            MetaQuery::parse(&data).unwrap_err(),
            MetaError::Truncated { need: 8 }
        );
    }
}
