//! cubed as a library: typed configuration, the server's run loop, and the local admin commands.
//! `main.rs` only parses flags, sets up logging and calls into here.

pub mod admin_cli;
pub mod admin_http;
pub mod certs;
pub mod config;
pub mod holder;
pub mod serve;
