"""Forms generated from the config's field metadata: field → widget, widget ↔ config value by path, validation marks."""
