"""The file system: sources to archive, atomic outputs, staging and path safety."""
