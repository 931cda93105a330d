//! What HAProxy answers by itself over HTTP: the statuses it has a built-in error page for.
//!
//! Owns that list. Pure. It must never decide which statuses a user may ask for (the sources
//! do), only which ones HAProxy can answer with its own page.

/// The statuses HAProxy (2.6 and 3.0 alike) has a built-in error page for: `http-response
/// return status <code> default-errorfiles` is refused by `haproxy -c` for any other code
/// ("status code '418' not handled by default with 'default-errorfiles' argument").
pub const ERROR_PAGES: &[u16] =
    &[400, 401, 403, 404, 405, 407, 408, 410, 413, 421, 422, 425, 429, 500, 501, 502, 503, 504];
