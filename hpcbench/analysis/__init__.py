"""Post-analysis of point files: tables and metrics. Imports no framework and no MPI."""
