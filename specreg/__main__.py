from specreg.cli.main import main

main()
