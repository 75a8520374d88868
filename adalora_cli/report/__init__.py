"""Reports from run directories: typed run records, tables, rendering, figures. No torch."""
