"""The app's secondary windows: concept, sample editor, optimizer and scheduler dialogs, timestep preview, tools."""
