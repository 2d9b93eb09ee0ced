//! Fencing: tokens, resources, the check with its ordering barrier, and the
//! durable store behind it, and the commit gate where a write's permit meets
//! its body.

pub mod cluster;
pub mod commit;
pub mod gate;
pub mod resource;
pub mod store;
pub mod token;
