from msgbusd.cli import main

main()
