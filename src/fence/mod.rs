//! Fencing: tokens, resources, the check with its ordering barrier, and the
//! durable store behind it.

pub mod gate;
pub mod resource;
pub mod store;
pub mod token;
