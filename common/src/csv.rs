//! CSV import/export.
