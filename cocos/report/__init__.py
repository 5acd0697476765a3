"""Reports: paper-ready tables (markdown, LaTeX), figures, triplet-weight diagrams."""
