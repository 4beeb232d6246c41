from nanocrab.cli import main

main()
