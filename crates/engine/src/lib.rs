//! The one request engine every target submits to (being built: issue 32 step 2).
