"""What the lab's tools share and is not the product's: the projects they tune (recipe files
in tools/projects/, read by the product's one recipe loader) and their measurement settings.
A tool imports from here, never from another tool."""
