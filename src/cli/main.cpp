// Placeholder entry point; the real CLI replaces this file.
int main() { return 0; }
