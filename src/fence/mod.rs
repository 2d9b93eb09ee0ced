//! Fencing: tokens, resources, the check with its ordering barrier, and the
//! durable fence table behind it, the body gate where a write's permit meets
//! its body, and the object hold that makes a conditional write one step;
//! the record of writes that may still land after the process is gone,
//! and the writes in doubt it and lost answers leave; the locks a raise is
//! verified with.

pub mod body_gate;
pub mod cluster;
pub mod doubt;
pub mod gate;
pub mod hold;
pub mod issued;
pub mod landing;
pub mod resource;
pub mod table;
pub mod token;
