//! Which names HAProxy takes as they are, unquoted: section names, HTTP header names, and names
//! written bare inside a sample fetch's parentheses.
//!
//! Owns the byte rules and the length limits of those names, so every source refuses the same
//! names for the same reason. Pure. It must never quote or rewrite a name (that is
//! [`crate::quote`]'s) and never accept a byte HAProxy's line parser treats specially.

/// The longest section name accepted, in bytes (Kubernetes names are at most 253; ours are
/// built from two of them and a port name).
pub const MAX_SECTION_NAME: usize = 512;

/// The longest header name accepted, in bytes, for every rule below that names a header. It is
/// the Gateway API's own bound on `HTTPHeaderName` (256), and both former copies of this rule
/// used it; HAProxy's only bound is its line length.
pub const MAX_HEADER_NAME: usize = 256;

/// Whether `s` is written as a section name as is: 1 to [`MAX_SECTION_NAME`] bytes of
/// `[a-z0-9._-]`, as Kubernetes names and port names are. HAProxy takes the word after
/// `backend`/`userlist`/… as the section's name, and the runtime API names a backend by exactly
/// that text, so it must need no quoting.
pub fn is_section_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SECTION_NAME
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

/// Whether `s` is an HTTP header (or cookie) name: an RFC 9110 token (letters, digits and
/// ``!#$&'*+-.^_`|~``) of 1 to [`MAX_HEADER_NAME`] bytes. HAProxy's HTTP parser accepts exactly
/// tokens as field names; `set-header`, `del-header` and cookie options take any of them once
/// quoted.
pub fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_HEADER_NAME
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b))
}

/// Whether `s` (a header or query parameter name, a method) can be written bare inside a sample
/// fetch's parentheses (`req.hdr(x-a)`, `url_param(q)`): a header name ([`is_header_name`]) of
/// letters, digits and `-_.` only. HAProxy's argument parser splits on `,` and ends at `)`, and
/// its line parser gives `#`, `'`, `"`, `\` and `$` their own meaning, so the other token bytes
/// are left out.
pub fn is_fetch_arg_name(s: &str) -> bool {
    is_header_name(s) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_names() {
        assert!(is_section_name("shop_web_80") && is_section_name("a.b-c"));
        assert!(!is_section_name("") && !is_section_name("Shop") && !is_section_name("a b") && !is_section_name("a#b"));
        assert!(is_section_name(&"a".repeat(MAX_SECTION_NAME)) && !is_section_name(&"a".repeat(MAX_SECTION_NAME + 1)));
    }

    #[test]
    fn header_and_fetch_names() {
        for ok in ["X-Request-Id", "a!#$&'*+-.^_`|~z", "Set-Cookie"] {
            assert!(is_header_name(ok), "{ok}");
        }
        for bad in ["", "a b", "a:b", "a\"b", "a,b", "a(b)", "é"] {
            assert!(!is_header_name(bad) && !is_fetch_arg_name(bad), "{bad:?}");
        }
        assert!(is_fetch_arg_name("x-a_b.c") && is_fetch_arg_name("GET"));
        assert!(!is_fetch_arg_name("a#b") && !is_fetch_arg_name("a'b") && !is_fetch_arg_name("a$b"));
        let long = "a".repeat(MAX_HEADER_NAME);
        assert!(is_header_name(&long) && is_fetch_arg_name(&long));
        assert!(!is_header_name(&format!("{long}a")) && !is_fetch_arg_name(&format!("{long}a")));
    }

    proptest::proptest! {
        /// A name that goes bare into a fetch is always a header name, under the same limit.
        #[test]
        fn a_fetch_name_is_a_header_name(s in "[ -~]{0,300}") {
            if is_fetch_arg_name(&s) {
                proptest::prop_assert!(is_header_name(&s) && s.len() <= MAX_HEADER_NAME);
            }
        }
    }
}
