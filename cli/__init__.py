"""lading's command line: parse options, call the library, render results."""
