//! The values annotations take: booleans, codes, URLs, paths, tokens, CIDRs, sizes, seconds.
//!
//! Owns what each kind of value may be, read into its typed form or refused with why. It must
//! never know which key a value belongs to: [`super::handlers`] does.

use haptic_haproxy::names::is_header_name;

use super::{Cidr, MAX_ERROR_PAGES};

pub(super) fn bool_of(v: &str) -> Result<bool, String> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{v:?} is not true or false")),
    }
}

pub(super) fn redirect_code(v: &str) -> Result<u16, String> {
    v.parse::<u16>()
        .ok()
        .filter(|c| (300..=308).contains(c))
        .ok_or_else(|| format!("{v:?} is not a redirect code (300–308)"))
}

/// A redirect target: an absolute `http(s)://` URL or a path, printable ASCII without blanks.
pub(super) fn location(v: &str) -> Result<String, String> {
    let ok_chars = v.bytes().all(|b| b.is_ascii_graphic());
    let ok_form = v.starts_with('/') || v.starts_with("http://") || v.starts_with("https://");
    if v.is_empty() || v.len() > 2048 || !ok_chars || !ok_form {
        return Err(format!("{v:?} is not an http(s):// URL or a path (printable ASCII, no blanks, ≤ 2048 bytes)"));
    }
    Ok(v.to_string())
}

/// `rewrite-target` as a `replace-path` format: a path of printable ASCII without blanks, where
/// `$1`…`$9` name the path regex's groups. nginx variables (`$host`, …), a query (`?`), a
/// backslash and two-digit group numbers are refused.
pub(super) fn rewrite_target(v: &str) -> Result<String, String> {
    if !v.starts_with('/') || v.len() > 2048 || !v.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!("{v:?} is not a path (printable ASCII, no blanks, ≤ 2048 bytes)"));
    }
    let b = v.as_bytes();
    let mut out = String::with_capacity(v.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'$' => match (b.get(i + 1), b.get(i + 2)) {
                (Some(d @ b'1'..=b'9'), next) if !next.is_some_and(u8::is_ascii_digit) => {
                    out.push('\\');
                    out.push(char::from(*d));
                    i += 2;
                    continue;
                }
                _ => return Err(format!("{v:?}: '$' is only accepted as $1 to $9 (no nginx variables)")),
            },
            b'\\' => return Err(format!("{v:?}: a backslash is not accepted")),
            b'?' => return Err(format!("{v:?}: a query is not accepted (the request's query is kept)")),
            c => out.push(char::from(c)),
        }
        i += 1;
    }
    Ok(out)
}

/// An HTTP token (RFC 9110): a cookie or header name.
pub(super) fn token(v: &str) -> Result<String, String> {
    if !is_header_name(v) {
        return Err(format!("{v:?} is not a token (letters, digits, !#$&'*+-.^_`|~)"));
    }
    Ok(v.to_string())
}

/// A comma-separated list of HTTP tokens (`GET, POST`), written back `, `-joined.
pub(super) fn tokens(v: &str) -> Result<String, String> {
    let list: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if list.is_empty() || v.len() > 4096 {
        return Err(format!("{v:?} is not a comma-separated list of names"));
    }
    list.into_iter().map(token).collect::<Result<Vec<_>, _>>().map(|l| l.join(", "))
}

/// A header or cookie name HAProxy takes as a sample fetch argument: `[A-Za-z0-9_.-]`.
pub(super) fn name_of(v: &str) -> Result<String, String> {
    let ok = !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if !ok {
        return Err(format!("{v:?} is not a header or cookie name (letters, digits, '_', '.', '-')"));
    }
    Ok(v.to_string())
}

/// An `upstream-vhost`: a host name or address, with an optional port.
pub(super) fn vhost(v: &str) -> Result<String, String> {
    let ok = !v.is_empty()
        && v.len() <= 261
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b))
        && !v.starts_with(['-', '.', ':']);
    if !ok {
        return Err(format!("{v:?} is not a host name with an optional port"));
    }
    Ok(v.to_ascii_lowercase())
}

pub(super) fn app_root(v: &str) -> Result<String, String> {
    if !v.starts_with('/') || v == "/" {
        return Err(format!("{v:?} is not a path other than /"));
    }
    location(v)
}

pub(super) fn cidrs(v: &str) -> Result<Vec<Cidr>, String> {
    let list: Vec<&str> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    if list.is_empty() {
        return Err("no CIDR given".into());
    }
    let mut out: Vec<Cidr> = list.into_iter().map(str::parse).collect::<Result<_, _>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// An nginx size: bytes, or with `k`/`m`/`g` (binary multiples, either case).
pub(super) fn size(v: &str) -> Result<u64, String> {
    let err = || format!("{v:?} is not a size (bytes, or a number with k, m or g)");
    let (num, mult) = match v.char_indices().last() {
        Some((i, c)) if c.eq_ignore_ascii_case(&'k') => (&v[..i], 1u64 << 10),
        Some((i, c)) if c.eq_ignore_ascii_case(&'m') => (&v[..i], 1 << 20),
        Some((i, c)) if c.eq_ignore_ascii_case(&'g') => (&v[..i], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(err)
}

/// `custom-http-errors`: comma-separated HTTP statuses 400–599 (blanks around commas allowed),
/// sorted and distinct, at most [`MAX_ERROR_PAGES`] of them.
pub(super) fn statuses(v: &str) -> Result<Vec<u16>, String> {
    if v.is_empty() {
        return Err("no status given (comma-separated HTTP statuses 400–599)".into());
    }
    if v.len() > 1024 {
        return Err(format!("{} bytes is not a list of statuses (at most {MAX_ERROR_PAGES} of 400–599)", v.len()));
    }
    let mut out = Vec::new();
    for s in v.split(',').map(str::trim) {
        let code = (s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u16>().ok())
            .flatten()
            .filter(|c| (400..=599).contains(c))
            .ok_or_else(|| format!("{s:?} is not an HTTP status from 400 to 599"))?;
        out.push(code);
    }
    out.sort_unstable();
    out.dedup();
    if out.len() > MAX_ERROR_PAGES {
        return Err(format!("{} statuses: at most {MAX_ERROR_PAGES}", out.len()));
    }
    Ok(out)
}

/// Whole seconds, 1 to a day (ingress-nginx takes plain numbers of seconds).
pub(super) fn seconds(v: &str) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|s| (1..=86_400).contains(s))
        .ok_or_else(|| format!("{v:?} is not a number of seconds (1–86400)"))
}
