//! Cells (docs/CELLS.md): relay instances placed by a director. A cell in
//! `reserve` mode admits hosts the director booked onto it without reading
//! the database; when the director goes quiet its dead-man controller falls
//! back to database admission, within the fleet's cap of trip slots.

pub mod admission;
pub mod bookings;
pub mod budget;
pub mod controller;
pub mod deadman;
pub mod effective;
pub mod feed;
pub mod runtime;
pub mod state;
pub mod switch_poll;
pub mod trip;
pub mod window;
pub mod writer;

/// The longest `cell.url`: a wrong cell's 4409 names the right one in its
/// close reason, which holds at most 120 bytes (the URL alone when
/// `wrong cell: ` does not fit too; docs/CELLS.md, "Admission").
pub const MAX_CELL_URL_BYTES: usize = 120;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a cell admits a daemon's hello: `db` checks the database on every
/// hello; `reserve` admits hosts the director booked here from memory.
/// The operator's switch (`relay_cell_admit_modes.admit_mode`) and the
/// cell's own effective row (`relay_cell_admit_effective.mode`) both hold one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AdmitMode {
    Db,
    Reserve,
}

impl AdmitMode {
    /// The stored and wire text: `db` or `reserve`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Db => "db",
            Self::Reserve => "reserve",
        }
    }
}

impl fmt::Display for AdmitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored mode that is neither `db` nor `reserve`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("admit mode must be db or reserve, not {0:?}")]
pub struct UnknownAdmitMode(pub String);

impl FromStr for AdmitMode {
    type Err = UnknownAdmitMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "db" => Ok(Self::Db),
            "reserve" => Ok(Self::Reserve),
            other => Err(UnknownAdmitMode(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_their_text() {
        for mode in [AdmitMode::Db, AdmitMode::Reserve] {
            assert_eq!(mode.as_str().parse::<AdmitMode>(), Ok(mode));
            assert_eq!(serde_json::to_string(&mode).expect("json"), format!("\"{mode}\""));
        }
        assert_eq!("DB".parse::<AdmitMode>(), Err(UnknownAdmitMode("DB".into())));
    }
}
