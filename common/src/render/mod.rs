//! Renderings of schedules and simulations: text grid, SVG, Chrome trace, table, JSON.
