"""Small reusable widgets: tooltips, a tab view whose tabs come and go."""
