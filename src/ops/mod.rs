//! Operating txbox: its metrics and, behind the feature `admin-http`, the HTTP
//! admin endpoint. Both are public as `txbox::metrics` and `txbox::admin`.

#[cfg(feature = "admin-http")]
pub mod admin;
#[cfg(feature = "admin-http")]
mod http;
pub mod metrics;
