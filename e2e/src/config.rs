//! Minimal valid HAProxy configurations for tests.

/// The body the [`basic_config`] frontend returns for every request.
pub const BASIC_BODY: &str = "hello";

/// A minimal master-worker config: a frontend on `127.0.0.1:http_port` answering `200 hello`,
/// with `extra` appended verbatim at the end (more sections, or lines for the frontend).
pub fn basic_config(http_port: u16, extra: &str) -> String {
    format!(
        "global\n\
         \x20   default-path config\n\
         \x20   stats timeout 30s\n\
         \n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect 5s\n\
         \x20   timeout client 5s\n\
         \x20   timeout server 5s\n\
         \n\
         frontend fe_main\n\
         \x20   bind 127.0.0.1:{http_port}\n\
         \x20   http-request return status 200 content-type text/plain string \"{BASIC_BODY}\"\n\
         {extra}\n"
    )
}
