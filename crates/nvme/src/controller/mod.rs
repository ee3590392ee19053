//! The NVMe controller with no socket in it (Linux nvmet's core, split the same
//! way): [`Core`] holds the subsystems and the controllers; a [`Queue`] is one
//! connection's view, taking commands with their data and answering with an
//! [`Action`]: a completion now, device work ([`IoCommand`]) to run wherever the
//! transport schedules it, or nothing yet (Asynchronous Event Requests, answered
//! through the controller's [`Notifier`]). Time comes in as an argument, so
//! keep-alive is testable without waiting.

mod admin_cmd;
mod core;
pub mod ctrl;
mod fabrics_cmd;
pub mod health;
pub mod identify;
mod io_cmd;
pub mod log_page;
mod queue;
mod status_map;
pub mod subsystem;

#[cfg(test)]
mod tests;

pub use self::core::{Core, Settings};
pub use ctrl::{Controller, Notifier};
pub use fabrics_cmd::{ADMIN_QUEUE_SIZE, VERSION};
pub use health::{CommandError, IoStats};
pub use io_cmd::{Accounting, IoCommand, IoOp};
pub use queue::{Action, Queue, Reply};
pub use status_map::status_for;
pub use subsystem::{default_nqn, Subsystem, DEFAULT_NQN_PREFIX, NSID};
